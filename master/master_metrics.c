/*
 * master_metrics.c - see master_metrics.h.
 */
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/metrics.h"
#include "master/master_metrics.h"

#define METRICSD_ENTRY "DAEMON {\n  metricsd cmd=\"metricsd\"\n}\n"

void master_metrics_conf(struct master_conf *conf, const struct imapconf *ic)
{
    struct master_conf *add = NULL;
    struct master_entry *ne;
    char *err = NULL;

    if (!conf || !metrics_enabled(ic) || master_conf_find(conf, "metricsd"))
        return;
    if (master_conf_load_string("metricsd", METRICSD_ENTRY,
                                strlen(METRICSD_ENTRY), &add, &err) < 0
        || add->nentries != 1) {
        log_error("master: metrics not served: %s", err ? err : "?");
        free(err);
        master_conf_free(&add);
        return;
    }
    ne = realloc(conf->entries, (conf->nentries + 1) * sizeof(*ne));
    if (!ne) {
        log_error("master: metrics not served: out of memory");
        master_conf_free(&add);
        return;
    }
    conf->entries = ne;
    conf->entries[conf->nentries++] = add->entries[0];
    add->nentries = 0;      /* the entry's strings moved to conf */
    master_conf_free(&add);
}

void master_metrics_start(const struct imapconf *ic)
{
    if (metrics_enabled(ic) && metrics_create(ic) == 0)
        log_info("master: metrics on metrics_listen=<%s>",
                 imapconf_getstring(ic, "metrics_listen"));
}

/*
 * masterstatus.c - print the master's status file as a table.
 *
 *   masterstatus [-C imapd.conf] [-s statusfile]
 *
 * The file (format in master/master_status.h) is read once, bounded to
 * 4 MiB; every line is parsed as "KIND NAME key=value ...", unknown keys
 * are ignored.  Exit 0 after printing; 1 with a message when the file is
 * missing, unreadable, or older than 10 s ("master not running?").
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"

#define MS_DEFAULT_CONFIG "/etc/imapd.conf"
#define MS_MAX_SIZE (4u << 20)
#define MS_STALE_SECS 10

/* The value of KEY= in the line (ptr,len), copied into out. */
static const char *field(const char *line, size_t len, const char *key,
                         char *out, size_t outlen)
{
    size_t kl = strlen(key), i = 0;

    while (i < len) {
        size_t start = i, end;
        while (i < len && line[i] != ' ') i++;
        end = i;
        if (end - start > kl && memcmp(line + start, key, kl) == 0
            && line[start + kl] == '=') {
            size_t vl = end - start - kl - 1;
            if (vl >= outlen) vl = outlen - 1;
            memcpy(out, line + start + kl + 1, vl);
            out[vl] = '\0';
            return out;
        }
        while (i < len && line[i] == ' ') i++;
    }
    snprintf(out, outlen, "-");
    return out;
}

/* Word number n (0-based) of the line. */
static const char *word(const char *line, size_t len, int n, char *out,
                        size_t outlen)
{
    size_t i = 0;

    for (;;) {
        size_t start, wl;
        while (i < len && line[i] == ' ') i++;
        start = i;
        while (i < len && line[i] != ' ') i++;
        if (start == i) break;
        if (n-- == 0) {
            wl = i - start;
            if (wl >= outlen) wl = outlen - 1;
            memcpy(out, line + start, wl);
            out[wl] = '\0';
            return out;
        }
    }
    snprintf(out, outlen, "-");
    return out;
}

int main(int argc, char **argv)
{
    const char *conffile = MS_DEFAULT_CONFIG, *statusfile = NULL;
    struct buf path = BUF_INITIALIZER, data = BUF_INITIALIZER;
    struct imapconf *ic = NULL;
    char *err = NULL;
    FILE *f;
    struct stat sb;
    char chunk[8192];
    size_t n, pos;
    int opt, pass;
    long updated = 0;

    log_init("masterstatus", LOG_TO_STDERR);
    while ((opt = getopt(argc, argv, "C:s:")) != -1) {
        switch (opt) {
        case 'C': conffile = optarg; break;
        case 's': statusfile = optarg; break;
        default:
            fprintf(stderr, "Usage: %s [-C imapd.conf] [-s statusfile]\n",
                    argv[0]);
            return 64;
        }
    }
    if (!statusfile) {
        if (imapconf_load(conffile, &ic, &err) < 0) {
            fprintf(stderr, "masterstatus: %s\n", err ? err : conffile);
            free(err);
            return 1;
        }
        buf_printf(&path, "%s/master.status",
                   imapconf_getstring(ic, "configdirectory"));
        statusfile = buf_cstring(&path);
    }

    f = fopen(statusfile, "r");
    if (!f || fstat(fileno(f), &sb) < 0) {
        fprintf(stderr, "masterstatus: cannot read %s: %s (master not "
                "running?)\n", statusfile, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    buf_set_max(&data, MS_MAX_SIZE);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (buf_append(&data, chunk, n) < 0) {
            fprintf(stderr, "masterstatus: %s is too large\n", statusfile);
            fclose(f);
            return 1;
        }
    }
    fclose(f);

    /* pass 0: master line; 1: services; 2: children; 3: events */
    for (pass = 0; pass < 4; pass++) {
        static const char *kinds[] = { "master", "service", "child",
                                       "event" };
        int header = 0;

        for (pos = 0; pos < data.len; ) {
            const char *line = data.s + pos;
            const char *nl = memchr(line, '\n', data.len - pos);
            size_t len = nl ? (size_t)(nl - line) : data.len - pos;
            char k[16], a[64], b[64], c[64], d[64], e[64], g[64], h[64];
            char l[512];

            pos += len + (nl ? 1 : 0);
            word(line, len, 0, k, sizeof(k));
            if (strcmp(k, kinds[pass]) != 0) continue;
            if (pass == 0) {
                updated = atol(field(line, len, "updated", a, sizeof(a)));
                printf("master pid %s, started %s\n",
                       field(line, len, "pid", b, sizeof(b)),
                       field(line, len, "started", c, sizeof(c)));
                continue;
            }
            if (!header) {
                if (pass == 1)
                    printf("\n%-16s %6s %6s %6s %8s %8s %7s  %s\n",
                           "SERVICE", "READY", "BUSY", "TOTAL", "SERVED",
                           "MAXCHILD", "BACKOFF", "LISTEN");
                else if (pass == 2)
                    printf("\n%-16s %8s %-9s %8s %8s\n", "CHILD", "PID",
                           "STATE", "SERVED", "AGE");
                else
                    printf("\n%-16s %8s %-9s %s\n", "EVENT", "PID", "STATE",
                           "NEXT");
                header = 1;
            }
            word(line, len, 1, a, sizeof(a));
            if (pass == 1)
                printf("%-16s %6s %6s %6s %8s %8s %7s  %s\n", a,
                       field(line, len, "ready", b, sizeof(b)),
                       field(line, len, "busy", c, sizeof(c)),
                       field(line, len, "total", d, sizeof(d)),
                       field(line, len, "served", e, sizeof(e)),
                       field(line, len, "maxchild", g, sizeof(g)),
                       field(line, len, "backoff", h, sizeof(h)),
                       field(line, len, "listen", l, sizeof(l)));
            else if (pass == 2)
                printf("%-16s %8s %-9s %8s %8s\n", a,
                       field(line, len, "pid", b, sizeof(b)),
                       field(line, len, "state", c, sizeof(c)),
                       field(line, len, "served", d, sizeof(d)),
                       field(line, len, "age", e, sizeof(e)));
            else
                printf("%-16s %8s %-9s %s\n", a,
                       field(line, len, "pid", b, sizeof(b)),
                       field(line, len, "state", c, sizeof(c)),
                       field(line, len, "next", d, sizeof(d)));
        }
    }
    buf_free(&data);
    buf_free(&path);
    imapconf_free(&ic);

    if (updated == 0 || time(NULL) - updated > MS_STALE_SECS
        || time(NULL) - sb.st_mtime > MS_STALE_SECS) {
        fprintf(stderr, "masterstatus: %s is stale (updated %ld s ago): "
                "master not running?\n", statusfile,
                (long)(time(NULL) - (updated ? updated : sb.st_mtime)));
        return 1;
    }
    return 0;
}

/* placeholder: the skiplist backend is being written */
#include "config.h"
#include "cyrusdb/cyrusdb_backends.h"

static int skiplist_open_placeholder(const char *fname, int flags, int variant,
                                 struct cyrusdb **db_r, const char **error_r)
{
    (void)fname; (void)flags; (void)variant; (void)db_r;
    *error_r = "backend not written yet";
    return CYRUSDB_NOTIMPLEMENTED;
}

const struct cyrusdb_backend cyrusdb_skiplist = {
    .name = "skiplist",
    .open = skiplist_open_placeholder,
};

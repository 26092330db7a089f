/*
 * layout.c - CONFIGDIR/cyrusdeliver.version: read, check, write.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "store/layout.h"

static char layout_msg[1024];

static const char *layout_say(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static const char *layout_say(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(layout_msg, sizeof(layout_msg), fmt, ap);
    va_end(ap);
    return layout_msg;
}

int layout_read(const char *confdir, int *version_r, const char **error_r)
{
    char path[4096], text[4096];
    const char *p;
    ssize_t n;
    int fd;
    char *end;
    long v;

    *version_r = 0;
    snprintf(path, sizeof(path), "%s/%s", confdir, LAYOUT_FNAME);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return LAYOUT_OK;
        if (error_r)
            *error_r = layout_say("%s: %s", path, strerror(errno));
        return LAYOUT_IOERROR;
    }
    n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n < 0) {
        if (error_r)
            *error_r = layout_say("%s: %s", path, strerror(errno));
        return LAYOUT_IOERROR;
    }
    text[n] = '\0';
    for (p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, "layout ", 7) != 0)
            continue;
        errno = 0;
        v = strtol(p + 7, &end, 10);
        if (errno || end == p + 7 || (*end && *end != '\n') || v < 1
            || v > 1000000)
            break;
        *version_r = (int)v;
        return LAYOUT_OK;
    }
    if (error_r)
        *error_r = layout_say("%s: no valid \"layout N\" line: the file is "
                              "damaged (a store of this version has "
                              "\"layout %d\")", path, LAYOUT_VERSION);
    return LAYOUT_BAD;
}

static int layout_write(const char *confdir, const char **error_r)
{
    char path[4096], tmp[4200], text[256];
    int fd, len, r = 0;

    snprintf(path, sizeof(path), "%s/%s", confdir, LAYOUT_FNAME);
    snprintf(tmp, sizeof(tmp), "%s.NEW", path);
    len = snprintf(text, sizeof(text),
                   "# the on-disk layout of this store; see ctl_cyrusdb(8)\n"
                   "layout %d\nindex %d\nskiplist %s\n", LAYOUT_VERSION,
                   LAYOUT_INDEX_VERSION, LAYOUT_SKIPLIST_VERSION);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || fs_write_all(fd, text, (size_t)len) < 0
        || fs_datasync(fd) < 0)
        r = -1;
    if (fd >= 0 && close(fd) < 0)
        r = -1;
    if (r == 0 && rename(tmp, path) < 0)
        r = -1;
    if (r == 0 && fs_fsync_dir(confdir) < 0)
        r = -1;
    if (r < 0) {
        if (error_r)
            *error_r = layout_say("write %s: %s", path, strerror(errno));
        unlink(tmp);
        return LAYOUT_IOERROR;
    }
    return LAYOUT_OK;
}

int layout_check(const char *confdir, int *found_r, const char **error_r)
{
    int v = 0, r;

    r = layout_read(confdir, &v, error_r);
    if (found_r)
        *found_r = v;
    if (r != LAYOUT_OK)
        return r;
    if (v > LAYOUT_VERSION) {
        if (error_r)
            *error_r = layout_say("%s/%s says layout %d; this cyrusdeliver "
                                  "knows layouts up to %d: it was written by "
                                  "a newer version.  Run that version, or "
                                  "restore a backup made with this one",
                                  confdir, LAYOUT_FNAME, v, LAYOUT_VERSION);
        return LAYOUT_NEWER;
    }
    if (v == LAYOUT_VERSION)
        return LAYOUT_OK;
    /* no file: a store from before the file existed is layout 1, which
     * needs no change.  (Upgrades from layout N to N+1 go here.) */
    r = layout_write(confdir, error_r);
    if (r != LAYOUT_OK)
        return r;
    log_info("layout written file=<%s/%s> layout=<%d> found=<%d>", confdir,
             LAYOUT_FNAME, LAYOUT_VERSION, v);
    return v == 0 ? LAYOUT_OK : LAYOUT_UPGRADED;
}

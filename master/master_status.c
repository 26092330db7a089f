/*
 * master_status.c - writes the status file described in master_status.h.
 *
 * Invariant: a reader sees either the previous or the new complete file
 * (written to NAME.tmp, then renamed over NAME); nothing is synced, as the
 * file is a view of the moment and is rebuilt every second.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "master/master_event.h"
#include "master/master_service.h"
#include "master/master_status.h"

static char *status_path;
static char *status_tmp;
static time_t status_started;
static double status_last = -1e9;
static int status_failed;

void master_status_init(const char *path)
{
    size_t len = strlen(path);

    master_status_remove();
    status_path = strdup(path);
    status_tmp = malloc(len + 5);
    if (!status_path || !status_tmp) log_fatal(71, "master: out of memory");
    memcpy(status_tmp, path, len);
    memcpy(status_tmp + len, ".tmp", 5);
    status_started = time(NULL);
    status_last = -1e9;
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void master_status_update(double now, int changed)
{
    struct buf b = BUF_INITIALIZER;
    int fd;

    if (!status_path) return;
    if (!changed && now - status_last < 1.0) return;
    status_last = now;

    buf_printf(&b, "master pid=%ld started=%ld updated=%ld\n",
               (long)getpid(), (long)status_started, (long)time(NULL));
    master_service_status(&b, now);
    master_event_status(&b, now);

    fd = open(status_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write_all(fd, b.s ? b.s : "", b.len) < 0) {
        if (!status_failed)
            log_error("master: cannot write status file=<%s> error=<%s>",
                      status_tmp, strerror(errno));
        status_failed = 1;
        if (fd >= 0) close(fd);
        unlink(status_tmp);
        buf_free(&b);
        return;
    }
    close(fd);
    if (rename(status_tmp, status_path) < 0) {
        if (!status_failed)
            log_error("master: cannot rename status file=<%s> error=<%s>",
                      status_path, strerror(errno));
        status_failed = 1;
        unlink(status_tmp);
    } else {
        status_failed = 0;
    }
    buf_free(&b);
}

void master_status_remove(void)
{
    if (status_path) unlink(status_path);
    free(status_path);
    free(status_tmp);
    status_path = status_tmp = NULL;
}

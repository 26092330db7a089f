/*
 * userstate.c - a backend's "moving"/"moved" mark of a user (see
 * userstate.h for the format and the readers).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lib/fsutil.h"
#include "lib/log.h"
#include "store/directory.h"
#include "store/store.h"
#include "store/userstate.h"

const char *userstate_name(enum userstate state)
{
    switch (state) {
    case USERSTATE_MOVING: return "moving";
    case USERSTATE_MOVED: return "moved";
    default: return "here";
    }
}

enum userstate userstate_get(const struct imapconf *conf, const char *userid,
                             struct buf *backend_r)
{
    struct buf path = BUF_INITIALIZER;
    char text[128];
    enum userstate st = USERSTATE_MOVING;
    ssize_t n;
    int fd;

    if (backend_r)
        buf_reset(backend_r);
    if (store_user_path(conf, userid, USERSTATE_SUFFIX, &path) != STORE_OK) {
        buf_free(&path);
        return USERSTATE_HERE;
    }
    fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            st = USERSTATE_HERE;
        else
            log_error("userstate: cannot read path=<%s> error=<%s>",
                      buf_cstring(&path), strerror(errno));
        buf_free(&path);
        return st;
    }
    n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n > 0 && text[n - 1] == '\n') {
        text[n - 1] = '\0';
        if (strcmp(text, "moving") == 0) {
            st = USERSTATE_MOVING;
            goto out;
        }
        if (strncmp(text, "moved ", 6) == 0 &&
            directory_valid_name(text + 6, strlen(text + 6))) {
            st = USERSTATE_MOVED;
            if (backend_r)
                buf_appendcstr(backend_r, text + 6);
            goto out;
        }
    }
    log_error("userstate: malformed mark path=<%s> (taken as moving)",
              buf_cstring(&path));
out:
    buf_free(&path);
    return st;
}

int userstate_set(const struct imapconf *conf, const char *userid,
                  enum userstate state, const char *backend)
{
    struct buf path = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    struct buf text = BUF_INITIALIZER;
    int r, fd = -1;

    if (state == USERSTATE_MOVED &&
        (!backend || !directory_valid_name(backend, strlen(backend))))
        return STORE_BADNAME;
    r = store_user_path(conf, userid, USERSTATE_SUFFIX, &path);
    if (r)
        goto out;
    if (state == USERSTATE_HERE) {
        if (unlink(buf_cstring(&path)) < 0) {
            if (errno != ENOENT && errno != ENOTDIR)
                r = store_from_errno(errno);
            goto out;
        }
        if (fs_fsync_parent(buf_cstring(&path)) < 0)
            r = STORE_IOERROR;
        goto out;
    }
    if (state == USERSTATE_MOVED)
        buf_printf(&text, "moved %s\n", backend);
    else
        buf_appendcstr(&text, "moving\n");
    buf_printf(&tmp, "%s.NEW", buf_cstring(&path));
    if (fs_mkdir_parent(buf_cstring(&path), 0750) < 0) {
        r = store_from_errno(errno);
        goto out;
    }
    fd = open(buf_cstring(&tmp), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
              0640);
    if (fd < 0 || fs_write_all(fd, text.s, text.len) < 0 ||
        fs_datasync(fd) < 0 || close(fd) < 0) {
        r = store_from_errno(errno);
        if (fd >= 0)
            close(fd);
        unlink(buf_cstring(&tmp));
        goto out;
    }
    if (rename(buf_cstring(&tmp), buf_cstring(&path)) < 0) {
        r = store_from_errno(errno);
        unlink(buf_cstring(&tmp));
        goto out;
    }
    if (fs_fsync_parent(buf_cstring(&path)) < 0)
        r = STORE_IOERROR;
out:
    if (r)
        log_error("userstate: cannot set user=<%s> state=<%s> error=<%s>",
                  userid, userstate_name(state), store_strerror(r));
    else
        log_info("userstate: user=<%s> state=<%s> backend=<%s>", userid,
                 userstate_name(state),
                 state == USERSTATE_MOVED ? backend : "");
    buf_free(&path);
    buf_free(&tmp);
    buf_free(&text);
    return r;
}

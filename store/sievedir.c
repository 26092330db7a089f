/*
 * sievedir.c - where users' Sieve scripts live (see sievedir.h).
 */
#include "config.h"

#include <string.h>

#include "store/sievedir.h"

int sievedir_root(const struct imapconf *conf, struct buf *out)
{
    const char *dir = imapconf_getstring(conf, "sievedir");

    buf_reset(out);
    if (dir && *dir)
        return buf_appendcstr(out, dir) == 0 ? 0 : -1;
    return buf_printf(out, "%s/sieve",
                      imapconf_getstring(conf, "configdirectory")) == 0
               ? 0 : -1;
}

static char sievedir_hash(const char *s)
{
    char c = s[0];

    if (c >= 'A' && c <= 'Z')
        return (char)(c - 'A' + 'a');
    if (c >= 'a' && c <= 'z')
        return c;
    return 'q';
}

/* A path component: not empty, not "." or "..", no '/'. */
static int sievedir_component_ok(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '/', len) || memchr(s, '\0', len))
        return 0;
    if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    return 1;
}

int sievedir_user_path(const struct imapconf *conf, const char *userid,
                       struct buf *out)
{
    struct buf user = BUF_INITIALIZER;
    const char *at = userid ? strchr(userid, '@') : NULL;
    size_t ulen = at ? (size_t)(at - userid) : (userid ? strlen(userid) : 0);
    size_t i;
    int r = -1;

    if (!userid || !sievedir_component_ok(userid, ulen) ||
        (at && !sievedir_component_ok(at + 1, strlen(at + 1))))
        goto out;
    if (buf_append(&user, userid, ulen) != 0)
        goto out;
    for (i = 0; i < user.len; i++)
        if (user.s[i] == '^')
            user.s[i] = '.';
    buf_cstring(&user);
    if (sievedir_root(conf, out) != 0)
        goto out;
    if (at && buf_printf(out, "/domain/%c/%s", sievedir_hash(at + 1),
                         at + 1) != 0)
        goto out;
    if (buf_printf(out, "/%c/%s", sievedir_hash(user.s), user.s) != 0)
        goto out;
    buf_cstring(out);
    r = 0;
out:
    buf_free(&user);
    if (r)
        buf_reset(out);
    return r;
}

int sievedir_active_path(const struct imapconf *conf, const char *userid,
                         struct buf *out)
{
    if (sievedir_user_path(conf, userid, out) != 0)
        return -1;
    if (buf_appendcstr(out, "/" SIEVEDIR_ACTIVE) != 0) {
        buf_reset(out);
        return -1;
    }
    buf_cstring(out);
    return 0;
}

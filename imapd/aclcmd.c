/*
 * aclcmd.c - RFC 4314 ACL commands (see aclcmd.h).
 *
 * SETACL and DELETEACL read the mailbox's ACL string, change the one
 * identifier's entry with acl_set() and write the whole string back with
 * mboxlist_setacl().  The read and the write are two database
 * operations: two ACL changes of one mailbox at the same moment may lose
 * one of them (the last writer wins), as with mbtool setacl.  Sessions
 * that have the mailbox selected pick the new rights up at their next
 * command (session.c).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/aclcmd.h"
#include "imapd/imapcmd.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "store/acl.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/userid.h"

#define ACLCMD_CREATE_SET (ACL_CREATE | ACL_DELETEMBOX)     /* "c" */
#define ACLCMD_DELETE_SET (ACL_DELETEMSG | ACL_EXPUNGE)     /* "d" */

/* A rights mask as the client sees it: canonical letters with the
 * obsolete c and d before a (as Cyrus shows them). */
static void aclcmd_letters(int mask, struct buf *out)
{
    char letters[12];

    acl_rights_string(mask & ~ACL_ADMIN, letters);
    buf_setcstr(out, letters);
    if (mask & ACLCMD_CREATE_SET)
        buf_putc(out, 'c');
    if (mask & ACLCMD_DELETE_SET)
        buf_putc(out, 'd');
    if (mask & ACL_ADMIN)
        buf_putc(out, 'a');
}

/* An astring: an atom when every byte allows it, a quoted string for
 * other printable ASCII, a literal when 8-bit bytes are there (an
 * identifier mbtool stored; acl_check() refuses control bytes). */
static void aclcmd_astring(struct prot *p, const char *s)
{
    static const char special[] = "(){ %*\"\\";
    const char *c;
    int atom = *s && strcasecmp(s, "NIL") != 0;

    for (c = s; *c; c++) {
        unsigned char u = (unsigned char)*c;

        if (u >= 0x80 || u < 0x20 || u == 0x7f) {
            prot_printf(p, "{%zu}\r\n", strlen(s));
            prot_puts(p, s);
            return;
        }
        if (u == 0x20 || strchr(special, u))
            atom = 0;
    }
    if (atom)
        prot_puts(p, s);
    else
        imap_put_quoted(p, s);
}

/* The rights text of SETACL: [+|-] letters.  0 with *mod_r ('+', '-' or
 * 0) and *mask_r; -1 with the offending letter in *bad_r. */
static int aclcmd_parse_rights(const char *text, int *mod_r, int *mask_r,
                               char *bad_r)
{
    int mask = 0;

    *mod_r = 0;
    if (*text == '+' || *text == '-')
        *mod_r = *text++;
    for (; *text; text++) {
        char one[2] = { *text, '\0' };
        int m;

        if (acl_parse_rights(one, &m) != 0) {
            *bad_r = *text;
            return -1;
        }
        mask |= m;
    }
    *mask_r = mask;
    return 0;
}

/* The identifier as the store keeps it, for mailbox `name`, into out:
 * "anyone"/"anonymous" (any case), else a user id through userid_canon(),
 * a name without a domain taking the mailbox's domain; a leading '-'
 * kept.  0, or -1 with *err_r. */
static int aclcmd_identifier(struct imap_session *s, const char *name,
                             const char *raw, struct buf *out,
                             const char **err_r)
{
    struct buf tmp = BUF_INITIALIZER;
    const char *id = raw, *dom;
    size_t dlen = 0;
    int neg = 0, r;

    *err_r = NULL;
    buf_reset(out);
    if (*id == '-') {
        neg = 1;
        id++;
    }
    if (!*id) {
        *err_r = "empty identifier";
        return -1;
    }
    if (neg)
        buf_putc(out, '-');
    if (strcasecmp(id, "anyone") == 0 || strcasecmp(id, "anonymous") == 0) {
        for (; *id; id++)
            buf_putc(out, (char)(*id | 0x20));
        return 0;
    }
    buf_setcstr(&tmp, id);
    dom = mboxname_domain(name, &dlen, NULL);
    if (dom && !strchr(id, '@')) {
        buf_putc(&tmp, '@');
        buf_append(&tmp, dom, dlen);
    }
    {
        struct buf canon = BUF_INITIALIZER;

        r = userid_canon(imap_policy(s), buf_cstring(&tmp), NULL, &canon,
                         err_r);
        if (r == STORE_OK)
            buf_append(out, canon.s, canon.len);
        buf_free(&canon);
    }
    buf_free(&tmp);
    if (r != STORE_OK) {
        if (!*err_r)
            *err_r = store_strerror(r);
        buf_reset(out);
        return -1;
    }
    buf_cstring(out);
    return 0;
}

/* Look the mailbox of cmd.arg[0] up for an ACL command: the user needs
 * `need` (0: any right).  STORE_OK with *e_r, *rights_r and the
 * internal name in name; else answered (NO) and non-zero returned. */
static int aclcmd_open(struct imap_session *s, int need, struct buf *name,
                       struct mboxlist_entry **e_r, int *rights_r)
{
    struct mboxlist *ml;
    int r, rights;

    *e_r = NULL;
    if (imap_name_arg(s, 0, name) != 0)
        return -1;
    ml = imap_mboxlist(s);
    if (!ml) {
        imap_reply_store_error(s, STORE_IOERROR);
        return -1;
    }
    r = imap_reachable(s, buf_cstring(name)) ?
        mboxlist_lookup(ml, buf_cstring(name), e_r) : STORE_NOTFOUND;
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        return -1;
    }
    rights = imap_rights(s, (*e_r)->name, (*e_r)->acl);
    if (!(rights & (ACL_LOOKUP | ACL_ADMIN)) || (need == 0 && !rights)) {
        mboxlist_entry_free(e_r);
        imap_reply_store_error(s, STORE_NOTFOUND);
        return -1;
    }
    if ((rights & need) != need) {
        mboxlist_entry_free(e_r);
        imap_reply(s, "NO", "[NOPERM] Permission denied");
        return -1;
    }
    *rights_r = rights;
    return 0;
}

/* The client's name of internal `name` (the argument as sent when the
 * conversion fails, which it does not for a name just looked up). */
static const char *aclcmd_external(struct imap_session *s, const char *name,
                                   struct buf *out)
{
    if (imap_to_external(s, name, out) != STORE_OK)
        buf_setcstr(out, imap_cmd_args(s)->arg[0]);
    return buf_cstring(out);
}

static void aclcmd_change(struct imap_session *s, int delete)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct buf name = BUF_INITIALIZER, id = BUF_INITIALIZER,
               acl = BUF_INITIALIZER, shown = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    const char *err = NULL;
    int mod = 0, mask = 0, old, newmask, rights, r;
    char bad = 0;

    if (!delete && aclcmd_parse_rights(c->words.s[1], &mod, &mask,
                                       &bad) != 0) {
        if ((unsigned char)bad > 0x20 && (unsigned char)bad < 0x7f)
            imap_reply(s, "BAD", "Unknown right '%c'", bad);
        else
            imap_reply(s, "BAD", "Unknown right");
        goto out;
    }
    if (aclcmd_open(s, ACL_ADMIN, &name, &e, &rights) != 0)
        goto out;
    if (aclcmd_identifier(s, e->name, c->words.s[0], &id, &err) != 0) {
        imap_reply(s, "NO", "[CANNOT] Invalid identifier: %s",
                   err ? err : "not a user id");
        goto out;
    }
    old = acl_entry_rights(e->acl, buf_cstring(&id));
    if (old < 0)
        old = 0;    /* a malformed ACL: acl_set refuses it below */
    if (delete)
        newmask = 0;
    else if (mod == '+')
        newmask = old | mask;
    else if (mod == '-')
        newmask = old & ~mask;
    else
        newmask = mask;
    if (acl_set(e->acl, buf_cstring(&id), newmask, &acl) != 0) {
        log_warning("imap: ACL not changed, stored ACL malformed "
                    "mailbox=<%s>", e->name);
        imap_reply(s, "NO", "[SERVERBUG] The mailbox's stored ACL is "
                            "damaged (an admin can reset it)");
        goto out;
    }
    r = mboxlist_setacl(imap_mboxlist(s), e->name, buf_cstring(&acl));
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    aclcmd_letters(newmask, &shown);
    log_info("imap: acl changed mailbox=<%s> identifier=<%s> rights=<%s> "
             "user=<%s>", e->name, buf_cstring(&id), buf_cstring(&shown),
             imap_userid(s));
    imap_reply(s, "OK", "%s completed", delete ? "DELETEACL" : "SETACL");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
    buf_free(&id);
    buf_free(&acl);
    buf_free(&shown);
}

void aclcmd_setacl(struct imap_session *s)
{
    aclcmd_change(s, 0);
}

void aclcmd_deleteacl(struct imap_session *s)
{
    aclcmd_change(s, 1);
}

struct aclcmd_getacl_rock {
    struct prot *p;
    struct buf letters;
    struct buf id;
};

static int aclcmd_getacl_entry(void *rock, const char *id, size_t idlen,
                               int mask)
{
    struct aclcmd_getacl_rock *gr = rock;

    buf_setmap(&gr->id, id, idlen);
    aclcmd_letters(mask, &gr->letters);
    prot_puts(gr->p, " ");
    aclcmd_astring(gr->p, buf_cstring(&gr->id));
    prot_puts(gr->p, " ");
    aclcmd_astring(gr->p, buf_cstring(&gr->letters));
    return 0;
}

void aclcmd_getacl(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER, ext = BUF_INITIALIZER;
    struct aclcmd_getacl_rock gr = { imap_prot(s), BUF_INITIALIZER,
                                     BUF_INITIALIZER };
    struct mboxlist_entry *e = NULL;
    int rights;

    if (aclcmd_open(s, ACL_ADMIN, &name, &e, &rights) != 0)
        goto out;
    if (acl_check(e->acl) != 0) {
        imap_reply(s, "NO", "[SERVERBUG] The mailbox's stored ACL is "
                            "damaged (an admin can reset it)");
        goto out;
    }
    prot_puts(gr.p, "* ACL ");
    aclcmd_astring(gr.p, aclcmd_external(s, e->name, &ext));
    (void)acl_each(e->acl, aclcmd_getacl_entry, &gr);
    prot_puts(gr.p, "\r\n");
    imap_reply(s, "OK", "GETACL completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
    buf_free(&ext);
    buf_free(&gr.letters);
    buf_free(&gr.id);
}

/* Does the identifier `id` hold admin rights on mailbox `name`?  The
 * admins list holds global admins (no domain) and domain admins
 * ("admin@D", for D's mailboxes only). */
static int aclcmd_id_is_admin(struct imap_session *s, const char *name,
                              const char *id)
{
    const char *udom = userid_domain(id), *mdom;
    size_t dlen = 0;

    if (*id == '-' || !(acl_rights("", id, imap_admins(s)) & ACL_ADMIN))
        return 0;
    if (!udom)
        return 1;
    mdom = mboxname_domain(name, &dlen, NULL);
    return mdom && dlen == strlen(udom) && memcmp(mdom, udom, dlen) == 0;
}

void aclcmd_listrights(struct imap_session *s)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct buf name = BUF_INITIALIZER, ext = BUF_INITIALIZER,
               id = BUF_INITIALIZER, req = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct prot *p = imap_prot(s);
    static const char all[] = "lrswipkxtea";
    const char *err = NULL;
    int rights, required = 0;

    if (aclcmd_open(s, ACL_ADMIN, &name, &e, &rights) != 0)
        goto out;
    if (aclcmd_identifier(s, e->name, c->words.s[0], &id, &err) != 0) {
        imap_reply(s, "NO", "[CANNOT] Invalid identifier: %s",
                   err ? err : "not a user id");
        goto out;
    }
    /* what cannot be taken away: an admin's own rights (acl.h) */
    if (aclcmd_id_is_admin(s, e->name, buf_cstring(&id)))
        required = ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX;
    aclcmd_letters(required, &req);
    prot_puts(p, "* LISTRIGHTS ");
    aclcmd_astring(p, aclcmd_external(s, e->name, &ext));
    prot_puts(p, " ");
    aclcmd_astring(p, buf_cstring(&id));
    prot_puts(p, " ");
    aclcmd_astring(p, buf_cstring(&req));
    for (const char *l = all; *l; l++) {
        char one[2] = { *l, '\0' };
        int m = 0;

        (void)acl_parse_rights(one, &m);
        if (!(required & m))
            prot_printf(p, " %c", *l);
    }
    if ((required & ACLCMD_CREATE_SET) != ACLCMD_CREATE_SET)
        prot_puts(p, " c");
    prot_puts(p, " d\r\n");
    imap_reply(s, "OK", "LISTRIGHTS completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
    buf_free(&ext);
    buf_free(&id);
    buf_free(&req);
}

void aclcmd_myrights(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER, ext = BUF_INITIALIZER,
               letters = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct prot *p = imap_prot(s);
    int rights;

    if (aclcmd_open(s, 0, &name, &e, &rights) != 0)
        goto out;
    aclcmd_letters(rights, &letters);
    prot_puts(p, "* MYRIGHTS ");
    aclcmd_astring(p, aclcmd_external(s, e->name, &ext));
    prot_puts(p, " ");
    aclcmd_astring(p, buf_cstring(&letters));
    prot_puts(p, "\r\n");
    imap_reply(s, "OK", "MYRIGHTS completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
    buf_free(&ext);
    buf_free(&letters);
}

/*
 * appendcmd.c - imapd's APPEND (see appendcmd.h).
 *
 * One APPEND command may carry several messages (RFC 3502), each a
 * literal, a literal8 (RFC 3516), UTF8 (literal8) (RFC 6855, once
 * enabled) or CATENATE (RFC 4469) of TEXT literals and URLs of messages
 * the user can read.  Each message is streamed into its own staging file
 * while the command is read; nothing touches the mailbox until the
 * command line has ended.  Then the messages are reserved in ONE
 * append transaction (the quota check for their sum first, keywords
 * defined strictly) and made durable and visible by ONE append_commit():
 * all of them or, on any failure (a refused literal, a size limit, quota,
 * a bad URL, a client that goes away mid-command), none.  No lock is held
 * while the client sends.
 */
#include "config.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/appendcmd.h"
#include "imapd/imapcmd.h"
#include "imapd/imapparse.h"
#include "imapd/imapurl.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "lib/strarray.h"
#include "store/acl.h"
#include "store/append.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/message.h"
#include "store/store.h"

/* One message of an APPEND, staged. */
struct appendcmd_msg {
    struct append_stage *st;
    uint32_t sysflags;          /* without \Seen when it goes to the
                                   user's seen state */
    int seen;                   /* the user's \Seen */
    int64_t date;               /* 0: now */
    struct strarray kws;
};

/* The APPEND in progress (the session holds it while its data is read,
 * for appendcmd_more()). */
struct appendcmd {
    struct mboxlist_entry *e;
    struct mailbox *mb;
    int rights;
    size_t limit;               /* APPENDLIMIT */
    struct appendcmd_msg *msgs;
    size_t n, alloc;
    struct appendcmd_msg *cur; /* the message being read, or NULL */
    size_t cursize;             /* its bytes so far (CATENATE) */
    int failed;                 /* the command fails: status and text */
    const char *status;         /* "NO" or "BAD" */
    char text[256];
    size_t total;               /* bytes of every message */
};

/* Record the command's first failure; later ones are left out. */
static void appendcmd_fail(struct appendcmd *a, const char *status,
                           const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void appendcmd_fail(struct appendcmd *a, const char *status,
                           const char *fmt, ...)
{
    va_list ap;

    if (a->failed)
        return;
    a->failed = 1;
    a->status = status;
    va_start(ap, fmt);
    vsnprintf(a->text, sizeof(a->text), fmt, ap);
    va_end(ap);
}

/* A store error as the NO imap_reply_store_error() would give. */
static void appendcmd_fail_store(struct appendcmd *a, int r)
{
    const char *code;

    switch (r) {
    case STORE_NOTFOUND: code = "[TRYCREATE] "; break;
    case STORE_BADNAME: code = "[CANNOT] "; break;
    case STORE_PERMISSION: code = "[NOPERM] "; break;
    case STORE_OVERQUOTA: code = "[OVERQUOTA] "; break;
    case STORE_TOOBIG: code = "[TOOBIG] "; break;
    case STORE_INTERNAL: code = "[SERVERBUG] "; break;
    default: code = "[UNAVAILABLE] "; break;
    }
    appendcmd_fail(a, "NO", "%s%s", code,
                   r == STORE_NOTFOUND ? "Mailbox does not exist"
                                       : store_strerror(r));
}

static void appendcmd_msg_free(struct appendcmd_msg *m)
{
    append_stage_free(&m->st);
    strarray_fini(&m->kws);
}

/* A new message (MESSAGE, CATENATE): flags, date, a staging file. */
static void appendcmd_begin(struct imap_session *s, struct appendcmd *a)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    const struct imapparse_append *ap = &c->append;
    struct appendcmd_msg *m;
    uint32_t fl;
    int r;

    a->cur = NULL;
    a->cursize = 0;
    if (ap->utf8 && !imap_utf8_accepted(s))
        appendcmd_fail(a, "BAD", "UTF8 message data needs ENABLE "
                                 "UTF8=ACCEPT");
    if (!a->failed && a->n >= APPENDCMD_MAX_MESSAGES)
        appendcmd_fail(a, "NO", "[LIMIT] Too many messages in one APPEND "
                                "(limit %d)", APPENDCMD_MAX_MESSAGES);
    if (a->failed)
        return;
    if (a->n == a->alloc) {
        size_t na = a->alloc ? a->alloc * 2 : 4;
        struct appendcmd_msg *nm = realloc(a->msgs, na * sizeof(*nm));

        if (!nm) {
            appendcmd_fail_store(a, STORE_NOMEM);
            return;
        }
        a->msgs = nm;
        a->alloc = na;
    }
    m = &a->msgs[a->n];
    memset(m, 0, sizeof(*m));
    r = append_stage_open(imap_conf(s), a->e->partition, &m->st);
    if (r != STORE_OK) {
        appendcmd_fail_store(a, r);
        return;
    }
    a->n++;
    fl = imap_sysflags_of(&ap->flags) & imap_settable(a->rights);
    /* the user's \Seen goes to the seen state, not the index */
    m->seen = imap_mb_useseen(a->mb) && (fl & MAILBOX_FLAG_SEEN);
    if (m->seen)
        fl &= ~(uint32_t)MAILBOX_FLAG_SEEN;
    m->sysflags = fl;
    m->date = ap->date_set ? (int64_t)ap->date : 0;
    if (a->rights & ACL_WRITE)
        imap_keyword_names(ap->flags.s, ap->flags.n, &m->kws);
    a->cur = m;
}

/* Bytes of the current message (a literal, a TEXT part, a URL's part). */
static void appendcmd_write(struct appendcmd *a, const char *data, size_t n)
{
    int r;

    if (a->failed || !a->cur)
        return;
    if (n > a->limit - a->cursize) {
        appendcmd_fail(a, "NO", "[TOOBIG] Message too large (limit %zu "
                                "bytes)", a->limit);
        return;
    }
    a->cursize += n;
    r = append_stage_write(a->cur->st, data, n);
    if (r != STORE_OK)
        appendcmd_fail_store(a, r);
}

/* The data of a MESSAGE or TEXT event: read all of it (kept while the
 * command has not failed).  0, or -1 when the connection is gone. */
static int appendcmd_read(struct imap_session *s, struct appendcmd *a)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct buf chunk = BUF_INITIALIZER;
    size_t left = c->append.size;
    int binary = c->append.binary;

    while (left > 0) {
        size_t n = 0;

        buf_reset(&chunk);
        if (prot_read_some(imap_prot(s), &chunk,
                           left < 65536 ? left : 65536, &n) != PROT_OK) {
            buf_free(&chunk);
            return -1;
        }
        if (!binary && memchr(chunk.s, '\0', n))
            appendcmd_fail(a, "BAD", "NUL in a literal (send binary data "
                                     "as a literal8 ~{n})");
        appendcmd_write(a, chunk.s, n);
        left -= n;
    }
    buf_free(&chunk);
    return 0;
}

/* The end of the current message. */
static void appendcmd_end(struct appendcmd *a)
{
    int r;

    if (a->failed || !a->cur)
        return;
    r = append_stage_close(a->cur->st);
    if (r != STORE_OK)
        appendcmd_fail_store(a, r);
    else
        a->total += append_stage_info(a->cur->st)->size;
    a->cur = NULL;
}

/* A BADURL answer (RFC 4469): the URL in the code, with what an
 * url-resp-text cannot hold left out. */
static void appendcmd_badurl(struct appendcmd *a, const char *url,
                             const char *why)
{
    char u[160];
    size_t k = 0;

    for (; *url && k + 1 < sizeof(u); url++)
        if (*url != ']' && (unsigned char)*url >= 0x20 &&
            (unsigned char)*url < 0x7f)
            u[k++] = *url;
    u[k] = '\0';
    appendcmd_fail(a, "NO", "[BADURL %s] %s", u, why);
}

/* Is the URL's host this server? */
static int appendcmd_url_host_ours(struct imap_session *s, const char *host)
{
    return strcasecmp(host, imap_servername(s)) == 0 ||
           strcasecmp(host, "localhost") == 0 ||
           strcmp(host, "127.0.0.1") == 0 || strcmp(host, "[::1]") == 0;
}

/* A URL part of a CATENATE: the bytes it names are written to the
 * current message, or the command fails with BADURL. */
static void appendcmd_url(struct imap_session *s, struct appendcmd *a)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    const char *text = c->append.url, *err = NULL;
    struct imapurl u;
    struct buf name = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    struct buf part = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct mailbox *mb = NULL;
    struct mailbox_record rec;
    struct imap_msgfile mf;
    struct message_section sec;
    uint32_t recno;
    int r;

    if (a->failed || !a->cur)
        return;
    memset(&mf, 0, sizeof(mf));
    mf.fd = -1;
    if (imapurl_parse(text, c->append.url_len, &u, &err) < 0) {
        appendcmd_badurl(a, text, err);
        goto out;
    }
    if (u.host && !appendcmd_url_host_ours(s, u.host)) {
        appendcmd_badurl(a, text, "Not a URL of this server");
        goto out;
    }
    if (u.user && strcmp(u.user, imap_userid(s)) != 0) {
        appendcmd_badurl(a, text, "The URL is for another user");
        goto out;
    }
    if (u.mailbox) {
        r = imap_to_internal(s, imap_strip_sep(s, u.mailbox, &tmp), &name,
                             &err);
        if (r == STORE_OK)
            r = imap_lookup(s, buf_cstring(&name), ACL_READ, &e);
        if (r == STORE_OK)
            r = mailbox_open(imap_conf(s), e->name, e->partition, &mb);
    } else if (imap_selected_mailbox(s)) {
        r = imap_lookup(s, mailbox_name(imap_selected_mailbox(s)), ACL_READ,
                        &e);
        if (r == STORE_OK)
            r = mailbox_open(imap_conf(s), e->name, e->partition, &mb);
    } else {
        r = STORE_NOTFOUND;
    }
    if (r != STORE_OK) {
        appendcmd_badurl(a, text, r == STORE_NOTFOUND || r == STORE_BADNAME
                                  || r == STORE_PERMISSION
                                  ? "No such mailbox" : store_strerror(r));
        goto out;
    }
    if (u.uidvalidity &&
        u.uidvalidity != mailbox_get_header(mb)->uidvalidity) {
        appendcmd_badurl(a, text, "UIDVALIDITY does not match");
        goto out;
    }
    r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        r = imap_read_uid(s, mb, u.uid, &recno, &rec);
        mailbox_unlock(mb);
    }
    if (r == STORE_OK)
        r = imap_msgfile_open(mb, u.uid, &mf);
    if (r != STORE_OK) {
        appendcmd_badurl(a, text, r == STORE_NOTFOUND ? "No such message"
                                                      : store_strerror(r));
        goto out;
    }
    memset(&sec, 0, sizeof(sec));
    sec.part = u.part;
    sec.npart = u.npart;
    sec.kind = u.kind;
    if (message_get_section(mf.msg, &sec, &part) != MESSAGE_OK) {
        appendcmd_fail_store(a, STORE_NOMEM);
        goto out;
    }
    if (u.section_set && part.len == 0) {
        appendcmd_badurl(a, text, "No such section");
        goto out;
    }
    {
        size_t off = u.partial ? u.origin : 0, n;

        if (off > part.len)
            off = part.len;
        n = part.len - off;
        if (u.partial && u.count && u.count < n)
            n = u.count;
        appendcmd_write(a, part.s + off, n);
    }
out:
    imap_msgfile_close(&mf);
    mailbox_close(&mb);
    mboxlist_entry_free(&e);
    imapurl_fini(&u);
    buf_free(&name);
    buf_free(&tmp);
    buf_free(&part);
}

/* The line's end: every staged message in, in one transaction. */
static void appendcmd_commit(struct imap_session *s, struct appendcmd *a)
{
    struct append_txn *t = NULL;
    struct strarray allkws = STRARRAY_INITIALIZER;
    struct buf set = BUF_INITIALIZER;
    uint32_t *uids = NULL, *seenuids = NULL, prev = 0, uidvalidity;
    size_t i, nseen = 0;
    int r, run = 0;

    uids = calloc(a->n, sizeof(*uids));
    seenuids = calloc(a->n, sizeof(*seenuids));
    r = uids && seenuids ? append_begin(imap_conf(s), &t) : STORE_NOMEM;
    if (r == STORE_OK)
        r = append_check_quota(t, a->mb, a->total, a->n);
    for (i = 0; i < a->n && r == STORE_OK; i++) {
        struct appendcmd_msg *m = &a->msgs[i];

        for (size_t k = 0; k < m->kws.count; k++)
            strarray_append(&allkws, m->kws.data[k]);
        /* keywords go into the record before the commit: the message is
         * never visible without them; one that cannot be defined (the
         * mailbox has 128) refuses the APPEND, as STORE refuses it */
        r = append_add_keywords(t, a->mb, m->st, m->date, m->sysflags,
                                (const char *const *)m->kws.data,
                                (size_t)m->kws.count,
                                APPEND_KEYWORDS_STRICT | APPEND_IGNORE_QUOTA,
                                &uids[i]);
        if (r == STORE_OK && m->seen)
            seenuids[nseen++] = uids[i];
    }
    if (r == STORE_OK)
        r = append_commit(t);
    else if (t)
        append_abort(t);
    uidvalidity = mailbox_get_header(a->mb)->uidvalidity;
    if (r == STORE_OVERQUOTA && imap_keywords_undefined(a->mb, &allkws)) {
        imap_reply(s, "NO", "[LIMIT] Too many keywords in this mailbox");
        goto out;
    }
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    imap_seen_add_uids(s, a->mb, seenuids, nseen);
    for (i = 0; i < a->n; i++) {
        log_info("imap: append user=<%s> mailbox=<%s> uid=<%u> size=<%u>",
                 imap_userid(s), a->e->name, (unsigned)uids[i],
                 (unsigned)append_stage_info(a->msgs[i].st)->size);
        imap_set_add(&set, uids[i], &prev, &run);
    }
    imap_set_end(&set, prev, run);
    imap_count_appended(s, a->n);
    imap_reply(s, "OK", "[APPENDUID %u %s] APPEND completed",
               (unsigned)uidvalidity, buf_cstring(&set));
out:
    append_free(&t);
    free(uids);
    free(seenuids);
    strarray_fini(&allkws);
    buf_free(&set);
}

/* The answer for a parser result that ended the command early. */
static void appendcmd_parse_error(struct imap_session *s,
                                  struct appendcmd *a, int pr)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);

    switch (pr) {
    case IMAPPARSE_REFUSED:
        if (a->failed)
            imap_reply(s, a->status, "%s", a->text);
        else
            imap_reply(s, imap_append_refused(s) == 1 ? "NO" : "BAD", "%s",
                       c->error);
        break;
    case IMAPPARSE_TOOBIG:
        if (c->append.size > imap_max_append(s))
            imap_reply(s, "NO", "[TOOBIG] %s", c->error);
        else
            imap_reply(s, "BAD", "%s", c->error);
        break;
    case IMAPPARSE_BAD:
    case IMAPPARSE_BADCHARSET:
        imap_reply(s, "BAD", "%s", c->error);
        break;
    case IMAPPARSE_TIMEOUT:
        prot_puts(imap_prot(s), "* BYE Autologout; idle for too long\r\n");
        imap_end_session(s, "autologout");
        break;
    case IMAPPARSE_DESYNC:
    case IMAPPARSE_NOMEM:
        prot_printf(imap_prot(s), "* BYE %s\r\n", c->error ? c->error
                                                       : "Protocol error");
        imap_end_session(s, "error");
        break;
    default:        /* EOF, IOERROR, INTERRUPTED: the client is gone */
        imap_end_session(s, NULL);
        break;
    }
}

/* APPEND: the command's events (imapparse.h) one by one; the first was
 * read with the command. */
void appendcmd_append(struct imap_session *s)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct appendcmd a;
    int r, pr = IMAPPARSE_OK;
    size_t i;

    memset(&a, 0, sizeof(a));
    a.limit = imap_append_limit(s);
    r = imap_dest_open(s, 0, &a.e, &a.mb);
    if (r != STORE_OK)
        appendcmd_fail_store(&a, r);
    else
        a.rights = imap_rights(s, a.e->name, a.e->acl);
    imap_set_append(s, &a);
    for (;;) {
        switch (c->append.event) {
        case IMAPPARSE_APPEND_MESSAGE:
            appendcmd_begin(s, &a);
            if (appendcmd_read(s, &a) != 0) {
                imap_end_session(s, NULL);
                goto out;
            }
            appendcmd_end(&a);
            break;
        case IMAPPARSE_APPEND_CATENATE:
            appendcmd_begin(s, &a);
            break;
        case IMAPPARSE_APPEND_TEXT:
            if (appendcmd_read(s, &a) != 0) {
                imap_end_session(s, NULL);
                goto out;
            }
            break;
        case IMAPPARSE_APPEND_URL:
            appendcmd_url(s, &a);
            break;
        case IMAPPARSE_APPEND_CATEND:
            appendcmd_end(&a);
            break;
        case IMAPPARSE_APPEND_END:
            goto done;
        }
        pr = imap_append_next(s);
        if (pr != IMAPPARSE_OK) {
            appendcmd_parse_error(s, &a, pr);
            goto out;
        }
    }
done:
    if (a.failed)
        imap_reply(s, a.status, "%s", a.text);
    else
        appendcmd_commit(s, &a);
out:
    imap_set_append(s, NULL);
    for (i = 0; i < a.n; i++)
        appendcmd_msg_free(&a.msgs[i]);
    free(a.msgs);
    mailbox_close(&a.mb);
    mboxlist_entry_free(&a.e);
}

int appendcmd_more(struct appendcmd *a, const struct imapparse_cmd *c,
                   int utf8_accept, size_t size, const char **error_r)
{
    /* a failed command takes no more data; a CATENATE message stays in
     * the limit as a whole */
    if (!a->failed && a->cur &&
        c->append.event == IMAPPARSE_APPEND_TEXT &&
        size > a->limit - a->cursize)
        appendcmd_fail(a, "NO", "[TOOBIG] Message too large (limit %zu "
                                 "bytes)", a->limit);
    if (!a->failed &&
        c->append.event == IMAPPARSE_APPEND_MESSAGE &&
        a->n >= APPENDCMD_MAX_MESSAGES)
        appendcmd_fail(a, "NO", "[LIMIT] Too many messages in one APPEND "
                                 "(limit %d)", APPENDCMD_MAX_MESSAGES);
    if (!a->failed && c->append.utf8 && !utf8_accept)
        appendcmd_fail(a, "BAD", "UTF8 message data needs ENABLE "
                                  "UTF8=ACCEPT");
    if (!a->failed)
        return 0;
    *error_r = a->text;
    return strcmp(a->status, "BAD") == 0 ? 2 : 1;
}

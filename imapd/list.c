/*
 * list.c - LIST and LSUB (list.h): RFC 3501, LIST-EXTENDED (RFC 5258),
 * LIST-STATUS (RFC 5819), SPECIAL-USE (RFC 6154).
 *
 * LIST works in three steps on names in the client's form:
 *   1. collect: the mailboxes the user may see (the l right), in mailbox
 *      order, and, when subscriptions matter (SUBSCRIBED selection or
 *      return option), the user's subscribed names;
 *   2. select: the candidates are the visible mailboxes, or with
 *      SUBSCRIBED the subscribed names (existing or not), narrowed by
 *      SPECIAL-USE to those with a special use; a candidate matching one
 *      of the patterns is listed.  With RECURSIVEMATCH, a candidate that
 *      matches no pattern marks its ancestors that do: they are listed
 *      (whether or not they meet the selection themselves) with
 *      CHILDINFO ("SUBSCRIBED").  Without a selection option, hierarchy
 *      levels that are no mailboxes but have visible mailboxes below are
 *      listed when a pattern with '%' stops at them;
 *   3. answer: the listed names in hierarchy order, each with its
 *      attributes (\NonExistent or, for the plain RFC 3501 form,
 *      \Noselect; \HasChildren / \HasNoChildren from the visible
 *      mailboxes; \Subscribed when asked; the special-use attributes of
 *      the user's own mailboxes, always: RFC 6154 allows them unasked and
 *      clients without LIST-EXTENDED read them so), and after each
 *      listed mailbox that exists, its STATUS line when RETURN (STATUS)
 *      was given (a mailbox whose STATUS fails, e.g. without the r right,
 *      gets none).
 * Lookups are linear over the collected names: LIST costs O(n^2) string
 * comparisons for n visible mailboxes (a few million for a thousand).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/list.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/subs.h"

static const char *const imaplist_uses[] = {
    "\\All", "\\Archive", "\\Drafts", "\\Flagged", "\\Junk", "\\Sent",
    "\\Trash", NULL
};

const char *imaplist_specialuse_canon(const char *attr)
{
    for (size_t i = 0; imaplist_uses[i]; i++)
        if (strcasecmp(attr, imaplist_uses[i]) == 0)
            return imaplist_uses[i];
    return NULL;
}

int imaplist_specialuse_list(const struct imapparse_strlist *use,
                             struct buf *out, const char **bad_r)
{
    buf_reset(out);
    for (size_t i = 0; i < use->n; i++) {
        const char *c = imaplist_specialuse_canon(use->s[i]);
        int dup = 0;

        if (!c) {
            *bad_r = use->s[i];
            buf_reset(out);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (imaplist_specialuse_canon(use->s[j]) == c)
                dup = 1;
        if (dup)
            continue;
        if (out->len)
            buf_putc(out, ' ');
        buf_appendcstr(out, c);
    }
    buf_cstring(out);
    return 0;
}

/* ---- collected state ------------------------------------------------ */

struct imaplist_item {
    char *ext;          /* client name */
    int childinfo;      /* RECURSIVEMATCH: a selected descendant that no
                           pattern matched */
};

struct imaplist_rock {
    const struct imaplist_session *ls;
    struct strarray names;       /* visible mailboxes, internal */
    struct strarray ext;         /* the same, client form */
    struct strarray uses;        /* their special use ("" for none or
                                    not the user's own) */
    struct strarray subs;        /* subscribed names, client form */
    struct strarray subs_int;    /* the same, internal */
    struct strarray pats;        /* reference + pattern, each */
    struct imaplist_item *items; /* listed */
    size_t nitems, itemalloc;
    int error;                   /* STORE_NOMEM met while collecting */
};

static int imaplist_own(const struct imaplist_session *ls, const char *name)
{
    return *ls->inbox && mboxname_is_self_or_child(ls->inbox, name);
}

static int imaplist_collect(void *rock, const struct mboxlist_entry *e)
{
    struct imaplist_rock *lr = rock;
    const struct imaplist_session *ls = lr->ls;
    struct buf ext = BUF_INITIALIZER;

    if (!ls->visible(ls->rock, e->name, e->acl))
        return 0;
    if (ls->to_external(ls->rock, e->name, &ext) == STORE_OK) {
        if (strarray_append(&lr->names, e->name) != 0 ||
            strarray_append(&lr->ext, buf_cstring(&ext)) != 0 ||
            strarray_append(&lr->uses, imaplist_own(ls, e->name) ?
                                       e->specialuse : "") != 0)
            lr->error = STORE_NOMEM;
    }
    buf_free(&ext);
    return lr->error;
}

static int imaplist_collect_sub(void *rock, const char *mailbox)
{
    struct imaplist_rock *lr = rock;
    struct buf ext = BUF_INITIALIZER;

    if (lr->ls->to_external(lr->ls->rock, mailbox, &ext) == STORE_OK &&
        (strarray_append(&lr->subs, buf_cstring(&ext)) != 0 ||
         strarray_append(&lr->subs_int, mailbox) != 0))
        lr->error = STORE_NOMEM;
    buf_free(&ext);
    return lr->error;
}

static int imaplist_subs(struct imaplist_rock *lr)
{
    struct subs_db *sub = NULL;
    int r = subs_open(lr->ls->conf, lr->ls->userid, &sub);

    if (r != STORE_OK) {
        log_error("imap: cannot open subscriptions user=<%s> error=<%s>",
                  lr->ls->userid, store_strerror(r));
        return r;
    }
    r = subs_list(sub, "*", imaplist_collect_sub, lr);
    subs_close(&sub);
    return r;
}

static void imaplist_rock_fini(struct imaplist_rock *lr)
{
    strarray_fini(&lr->names);
    strarray_fini(&lr->ext);
    strarray_fini(&lr->uses);
    strarray_fini(&lr->subs);
    strarray_fini(&lr->subs_int);
    strarray_fini(&lr->pats);
    for (size_t i = 0; i < lr->nitems; i++)
        free(lr->items[i].ext);
    free(lr->items);
}

/* reference + pattern, with a leading INBOX upper-cased, into out */
static void imaplist_pattern(const struct imaplist_session *ls,
                             const char *ref, const char *pat,
                             struct buf *out)
{
    buf_setcstr(out, ref);
    buf_appendcstr(out, pat);
    if (out->len >= 5 && strncasecmp(out->s, "INBOX", 5) == 0 &&
        (out->len == 5 || out->s[5] == ls->sep))
        memcpy(out->s, "INBOX", 5);
}

/* Does a pattern match ext?  pct_only: only patterns holding '%'. */
static int imaplist_match(const struct imaplist_rock *lr, const char *ext,
                          int pct_only)
{
    for (size_t i = 0; i < lr->pats.count; i++) {
        const char *p = lr->pats.data[i];

        if (!*p || (pct_only && !strchr(p, '%')))
            continue;
        if (mboxname_match(p, ext, lr->ls->sep))
            return 1;
    }
    return 0;
}

static struct imaplist_item *imaplist_add(struct imaplist_rock *lr,
                                          const char *ext)
{
    struct imaplist_item *it;

    for (size_t i = 0; i < lr->nitems; i++)
        if (strcmp(lr->items[i].ext, ext) == 0)
            return &lr->items[i];
    if (lr->nitems == lr->itemalloc) {
        size_t na = lr->itemalloc ? lr->itemalloc * 2 : 16;
        struct imaplist_item *ni = realloc(lr->items, na * sizeof(*ni));

        if (!ni) {
            lr->error = STORE_NOMEM;
            return NULL;
        }
        lr->items = ni;
        lr->itemalloc = na;
    }
    it = &lr->items[lr->nitems];
    it->ext = strdup(ext);
    it->childinfo = 0;
    if (!it->ext) {
        lr->error = STORE_NOMEM;
        return NULL;
    }
    lr->nitems++;
    return it;
}

/* Has a visible mailbox below ext? */
static int imaplist_has_children(const struct imaplist_rock *lr,
                                 const char *ext)
{
    size_t n = strlen(ext);

    for (size_t i = 0; i < lr->ext.count; i++) {
        const char *v = lr->ext.data[i];

        if (strncmp(v, ext, n) == 0 && v[n] == lr->ls->sep)
            return 1;
    }
    return 0;
}

/* Hierarchy order: the separator sorts before every other byte, so that
 * "a.b" follows "a" and precedes "a-b". */
static char imaplist_sortsep;

static int imaplist_cmp(const void *a, const void *b)
{
    const unsigned char *x =
        (const unsigned char *)((const struct imaplist_item *)a)->ext;
    const unsigned char *y =
        (const unsigned char *)((const struct imaplist_item *)b)->ext;
    unsigned char sep = (unsigned char)imaplist_sortsep;

    for (;; x++, y++) {
        unsigned cx = *x == sep ? 1 : *x, cy = *y == sep ? 1 : *y;

        if (cx != cy)
            return cx < cy ? -1 : 1;
        if (!cx)
            return 0;
    }
}

static void imaplist_quoted(struct prot *p, const char *str)
{
    prot_puts(p, "\"");
    for (; *str; str++) {
        if (*str == '"' || *str == '\\')
            prot_puts(p, "\\");
        prot_write(p, str, 1);
    }
    prot_puts(p, "\"");
}

static void imaplist_line(const struct imaplist_session *ls, const char *what,
                          const char *flags, const char *name,
                          const char *extdata)
{
    prot_printf(ls->p, "* %s (%s) \"%s\" ", what, flags,
                ls->sep == '/' ? "/" : ".");
    imaplist_quoted(ls->p, name);
    if (extdata)
        prot_printf(ls->p, " %s", extdata);
    prot_puts(ls->p, "\r\n");
}

static void imaplist_addflag(struct buf *flags, const char *f)
{
    if (!*f)
        return;
    if (flags->len)
        buf_putc(flags, ' ');
    buf_appendcstr(flags, f);
}

/* ---- LIST ----------------------------------------------------------- */

void imaplist_cmd_list(const struct imaplist_session *ls,
                       struct mboxlist *ml, const struct imapparse_cmd *cmd)
{
    const struct imapparse_list *opt = &cmd->list;
    struct imaplist_rock lr;
    struct buf pat = BUF_INITIALIZER, flags = BUF_INITIALIZER;
    struct buf anc = BUF_INITIALIZER;
    const struct strarray *cand;
    int extended = opt->extended;
    int want_subs = (opt->select & IMAPPARSE_LSEL_SUBSCRIBED) ||
                    (opt->ret & IMAPPARSE_LRET_SUBSCRIBED);
    int recursive = (opt->select & IMAPPARSE_LSEL_RECURSIVEMATCH) != 0;
    int nonempty = 0;
    char sep = ls->sep;
    int r;

    memset(&lr, 0, sizeof(lr));
    lr.ls = ls;
    for (size_t i = 0; i < opt->patterns.n; i++) {
        imaplist_pattern(ls, cmd->arg[0], opt->patterns.s[i], &pat);
        if (opt->patterns.s[i][0])
            nonempty = 1;
        if (strarray_append(&lr.pats, buf_cstring(&pat)) != 0) {
            ls->store_no(ls->rock, STORE_NOMEM);
            goto out;
        }
    }
    if (!nonempty) {
        /* the hierarchy delimiter and the root of the reference */
        imaplist_line(ls, "LIST", "\\Noselect", "", NULL);
        ls->tagged(ls->rock, "OK", "LIST completed");
        goto out;
    }
    if (!ml) {
        ls->store_no(ls->rock, STORE_IOERROR);
        goto out;
    }
    r = mboxlist_list(ml, "*", imaplist_collect, &lr);
    if (r == STORE_OK && want_subs)
        r = imaplist_subs(&lr);
    if (r == STORE_OK)
        r = lr.error;
    if (r != STORE_OK) {
        ls->store_no(ls->rock, r);
        goto out;
    }

    /* 2. select */
    cand = (opt->select & IMAPPARSE_LSEL_SUBSCRIBED) ? &lr.subs : &lr.ext;
    for (size_t i = 0; i < cand->count; i++) {
        const char *c = cand->data[i];

        if (opt->select & IMAPPARSE_LSEL_SPECIALUSE) {
            long v = strarray_find(&lr.ext, c);

            if (v < 0 || !*lr.uses.data[v])
                continue;
        }
        if (imaplist_match(&lr, c, 0)) {
            imaplist_add(&lr, c);
            continue;
        }
        if (!recursive)
            continue;
        for (const char *d = strchr(c, sep); d; d = strchr(d + 1, sep)) {
            struct imaplist_item *it;

            buf_setmap(&anc, c, (size_t)(d - c));
            if (!imaplist_match(&lr, buf_cstring(&anc), 0))
                continue;
            it = imaplist_add(&lr, buf_cstring(&anc));
            if (it)
                it->childinfo = 1;
        }
    }
    if (!(opt->select & (IMAPPARSE_LSEL_SUBSCRIBED |
                         IMAPPARSE_LSEL_SPECIALUSE))) {
        /* levels above visible mailboxes that are no mailboxes, where a
         * '%' pattern stops */
        for (size_t i = 0; i < lr.ext.count; i++) {
            const char *c = lr.ext.data[i];

            for (const char *d = strchr(c, sep); d; d = strchr(d + 1, sep)) {
                buf_setmap(&anc, c, (size_t)(d - c));
                if (strarray_find(&lr.ext, buf_cstring(&anc)) < 0 &&
                    imaplist_match(&lr, buf_cstring(&anc), 1))
                    imaplist_add(&lr, buf_cstring(&anc));
            }
        }
    }
    if (lr.error) {
        ls->store_no(ls->rock, lr.error);
        goto out;
    }

    /* 3. answer */
    imaplist_sortsep = sep;
    if (lr.nitems > 1)
        qsort(lr.items, lr.nitems, sizeof(*lr.items), imaplist_cmp);
    for (size_t i = 0; i < lr.nitems; i++) {
        const struct imaplist_item *it = &lr.items[i];
        long v = strarray_find(&lr.ext, it->ext);
        int children = imaplist_has_children(&lr, it->ext);

        buf_reset(&flags);
        if (v < 0)
            imaplist_addflag(&flags, extended ? "\\NonExistent"
                                              : "\\Noselect");
        if (v >= 0 || children)
            imaplist_addflag(&flags, children ? "\\HasChildren"
                                              : "\\HasNoChildren");
        if (want_subs && strarray_find(&lr.subs, it->ext) >= 0)
            imaplist_addflag(&flags, "\\Subscribed");
        if (v >= 0)
            imaplist_addflag(&flags, lr.uses.data[v]);
        imaplist_line(ls, "LIST", buf_cstring(&flags), it->ext,
                      it->childinfo ? "(\"CHILDINFO\" (\"SUBSCRIBED\"))"
                                    : NULL);
        if (v >= 0 && (opt->ret & IMAPPARSE_LRET_STATUS))
            (void)ls->status(ls->rock, it->ext, lr.names.data[v],
                             &opt->status);
    }
    ls->tagged(ls->rock, "OK", "LIST completed");
out:
    imaplist_rock_fini(&lr);
    buf_free(&pat);
    buf_free(&flags);
    buf_free(&anc);
}

/* ---- LSUB ----------------------------------------------------------- */

/* The subscribed names that match the pattern, \Noselect when the user
 * cannot see such a mailbox, with the special use of the user's own; with
 * '%' in the pattern also the levels above subscribed names that match
 * where the names do not, as \Noselect (RFC 3501 6.3.9: "foo" for
 * "foo.bar" under "%"). */
void imaplist_cmd_lsub(const struct imaplist_session *ls,
                       struct mboxlist *ml, const struct imapparse_cmd *cmd)
{
    struct imaplist_rock lr;
    struct strarray shown = STRARRAY_INITIALIZER;
    struct buf pat = BUF_INITIALIZER, anc = BUF_INITIALIZER;
    struct buf flags = BUF_INITIALIZER;
    char sep = ls->sep;
    int r, pct;

    memset(&lr, 0, sizeof(lr));
    lr.ls = ls;
    if (cmd->arg[1][0] == '\0') {
        imaplist_line(ls, "LSUB", "\\Noselect", "", NULL);
        ls->tagged(ls->rock, "OK", "LSUB completed");
        return;
    }
    if (!ml) {
        ls->store_no(ls->rock, STORE_IOERROR);
        return;
    }
    imaplist_pattern(ls, cmd->arg[0], cmd->arg[1], &pat);
    pct = strchr(buf_cstring(&pat), '%') != NULL;
    r = imaplist_subs(&lr);
    if (r == STORE_OK)
        r = lr.error;
    if (r != STORE_OK) {
        ls->store_no(ls->rock, r);
        goto out;
    }
    for (size_t i = 0; i < lr.subs.count; i++) {
        const char *ext = lr.subs.data[i];
        const char *name = lr.subs_int.data[i];
        struct mboxlist_entry *e = NULL;

        if (pct) {
            for (const char *c = strchr(ext, sep); c; c = strchr(c + 1, sep)) {
                buf_setmap(&anc, ext, (size_t)(c - ext));
                if (strarray_find(&lr.subs, buf_cstring(&anc)) >= 0 ||
                    strarray_find(&shown, buf_cstring(&anc)) >= 0 ||
                    !mboxname_match(buf_cstring(&pat), buf_cstring(&anc),
                                    sep))
                    continue;
                imaplist_line(ls, "LSUB", "\\Noselect", buf_cstring(&anc),
                              NULL);
                strarray_append(&shown, buf_cstring(&anc));
            }
        }
        if (!mboxname_match(buf_cstring(&pat), ext, sep))
            continue;
        buf_reset(&flags);
        if (mboxlist_lookup(ml, name, &e) == STORE_OK &&
            ls->visible(ls->rock, e->name, e->acl)) {
            if (imaplist_own(ls, e->name))
                imaplist_addflag(&flags, e->specialuse);
        } else {
            imaplist_addflag(&flags, "\\Noselect");
        }
        mboxlist_entry_free(&e);
        imaplist_line(ls, "LSUB", buf_cstring(&flags), ext, NULL);
    }
    ls->tagged(ls->rock, "OK", "LSUB completed");
out:
    imaplist_rock_fini(&lr);
    strarray_fini(&shown);
    buf_free(&pat);
    buf_free(&anc);
    buf_free(&flags);
}

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
 *      gets none), then with RETURN (MYRIGHTS) its MYRIGHTS line.
 * Lookups go through sorted indexes of hierarchy keys (the client name
 * with the separator as 0x01, which sorts before every byte a name may
 * hold, so a name's descendants follow it at once): LIST costs
 * O(n log n) for n visible mailboxes and subscriptions.
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
    char *key;          /* its hierarchy key (imaplist_key()) */
    int childinfo;      /* RECURSIVEMATCH: a selected descendant that no
                           pattern matched */
};

/* A sorted index over a strarray of client names. */
struct imaplist_index {
    char **keys;        /* hierarchy keys, sorted */
    size_t *pos;        /* the index of each in the strarray */
    size_t n;
};

struct imaplist_rock {
    const struct imaplist_session *ls;
    struct strarray names;       /* visible mailboxes, internal */
    struct strarray acls;        /* their ACLs */
    struct strarray ext;         /* the same, client form */
    struct strarray uses;        /* their special use ("" for none or
                                    not the user's own) */
    struct strarray subs;        /* subscribed names, client form */
    struct strarray subs_int;    /* the same, internal */
    struct strarray pats;        /* reference + pattern, each */
    struct imaplist_index vidx;  /* over ext */
    struct imaplist_index sidx;  /* over subs */
    struct imaplist_item *items; /* listed (duplicates until sorted) */
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
            strarray_append(&lr->acls, e->acl) != 0 ||
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

/* ---- hierarchy keys and indexes ------------------------------------- */

#define IMAPLIST_KEYSEP '\001'

/* The client name with the separator as 0x01 (names hold no control
 * bytes), a new string, or NULL out of memory. */
static char *imaplist_key(const char *ext, char sep)
{
    char *k = strdup(ext);

    if (k)
        for (char *p = k; *p; p++)
            if (*p == sep)
                *p = IMAPLIST_KEYSEP;
    return k;
}

static char **imaplist_sort_keys;   /* qsort has no context argument */

static int imaplist_pos_cmp(const void *a, const void *b)
{
    return strcmp(imaplist_sort_keys[*(const size_t *)a],
                  imaplist_sort_keys[*(const size_t *)b]);
}

static void imaplist_index_free(struct imaplist_index *ix)
{
    for (size_t i = 0; i < ix->n; i++)
        free(ix->keys[i]);
    free(ix->keys);
    free(ix->pos);
    memset(ix, 0, sizeof(*ix));
}

/* Index names: STORE_OK or STORE_NOMEM. */
static int imaplist_index_build(struct imaplist_index *ix,
                                const struct strarray *names, char sep)
{
    char **keys;
    size_t n = names->count;

    memset(ix, 0, sizeof(*ix));
    if (!n)
        return STORE_OK;
    keys = calloc(n, sizeof(*keys));
    ix->pos = calloc(n, sizeof(*ix->pos));
    ix->keys = calloc(n, sizeof(*ix->keys));
    if (!keys || !ix->pos || !ix->keys) {
        free(keys);
        imaplist_index_free(ix);
        return STORE_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = imaplist_key(names->data[i], sep);
        ix->pos[i] = i;
        if (!keys[i]) {
            for (size_t j = 0; j < i; j++)
                free(keys[j]);
            free(keys);
            imaplist_index_free(ix);
            return STORE_NOMEM;
        }
    }
    imaplist_sort_keys = keys;
    qsort(ix->pos, n, sizeof(*ix->pos), imaplist_pos_cmp);
    imaplist_sort_keys = NULL;
    for (size_t i = 0; i < n; i++)
        ix->keys[i] = keys[ix->pos[i]];
    ix->n = n;
    free(keys);
    return STORE_OK;
}

/* The first slot whose key is >= key. */
static size_t imaplist_lower(const struct imaplist_index *ix,
                             const char *key)
{
    size_t lo = 0, hi = ix->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (strcmp(ix->keys[mid], key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The strarray index of the name with hierarchy key `key`, or -1. */
static long imaplist_find(const struct imaplist_index *ix, const char *key)
{
    size_t i = imaplist_lower(ix, key);

    return i < ix->n && strcmp(ix->keys[i], key) == 0 ? (long)ix->pos[i]
                                                       : -1;
}

/* Is a name below `key` indexed?  Descendants sort right after key. */
static int imaplist_below(const struct imaplist_index *ix, const char *key)
{
    size_t n = strlen(key), i = imaplist_lower(ix, key);

    if (i < ix->n && strcmp(ix->keys[i], key) == 0)
        i++;
    return i < ix->n && strncmp(ix->keys[i], key, n) == 0 &&
           ix->keys[i][n] == IMAPLIST_KEYSEP;
}

static void imaplist_rock_fini(struct imaplist_rock *lr)
{
    strarray_fini(&lr->names);
    strarray_fini(&lr->acls);
    strarray_fini(&lr->ext);
    strarray_fini(&lr->uses);
    strarray_fini(&lr->subs);
    strarray_fini(&lr->subs_int);
    strarray_fini(&lr->pats);
    for (size_t i = 0; i < lr->nitems; i++) {
        free(lr->items[i].ext);
        free(lr->items[i].key);
    }
    free(lr->items);
    imaplist_index_free(&lr->vidx);
    imaplist_index_free(&lr->sidx);
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

/* Add a name to the listed ones (duplicates are merged after sorting). */
static struct imaplist_item *imaplist_add(struct imaplist_rock *lr,
                                          const char *ext)
{
    struct imaplist_item *it;

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
    it->key = imaplist_key(ext, lr->ls->sep);
    it->childinfo = 0;
    if (!it->ext || !it->key) {
        free(it->ext);
        free(it->key);
        lr->error = STORE_NOMEM;
        return NULL;
    }
    lr->nitems++;
    return it;
}

static int imaplist_item_cmp(const void *a, const void *b)
{
    return strcmp(((const struct imaplist_item *)a)->key,
                  ((const struct imaplist_item *)b)->key);
}

/* Sort the listed names into hierarchy order, merging duplicates. */
static void imaplist_items_sort(struct imaplist_rock *lr)
{
    size_t out = 0;

    if (lr->nitems > 1)
        qsort(lr->items, lr->nitems, sizeof(*lr->items), imaplist_item_cmp);
    for (size_t i = 0; i < lr->nitems; i++) {
        if (out && strcmp(lr->items[out - 1].key, lr->items[i].key) == 0) {
            lr->items[out - 1].childinfo |= lr->items[i].childinfo;
            free(lr->items[i].ext);
            free(lr->items[i].key);
            continue;
        }
        lr->items[out++] = lr->items[i];
    }
    lr->nitems = out;
}

/* The strarray index of a client name in an index, or -1. */
static long imaplist_lookup(const struct imaplist_rock *lr,
                            const struct imaplist_index *ix, const char *ext)
{
    char *key = imaplist_key(ext, lr->ls->sep);
    long r = key ? imaplist_find(ix, key) : -1;

    free(key);
    return r;
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
    if (r == STORE_OK)
        r = imaplist_index_build(&lr.vidx, &lr.ext, sep);
    if (r == STORE_OK)
        r = imaplist_index_build(&lr.sidx, &lr.subs, sep);
    if (r != STORE_OK) {
        ls->store_no(ls->rock, r);
        goto out;
    }

    /* 2. select */
    cand = (opt->select & IMAPPARSE_LSEL_SUBSCRIBED) ? &lr.subs : &lr.ext;
    for (size_t i = 0; i < cand->count; i++) {
        const char *c = cand->data[i];

        if (opt->select & IMAPPARSE_LSEL_SPECIALUSE) {
            long v = imaplist_lookup(&lr, &lr.vidx, c);

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
                if (imaplist_match(&lr, buf_cstring(&anc), 1) &&
                    imaplist_lookup(&lr, &lr.vidx, buf_cstring(&anc)) < 0)
                    imaplist_add(&lr, buf_cstring(&anc));
            }
        }
    }
    if (lr.error) {
        ls->store_no(ls->rock, lr.error);
        goto out;
    }

    /* 3. answer */
    imaplist_items_sort(&lr);
    for (size_t i = 0; i < lr.nitems; i++) {
        const struct imaplist_item *it = &lr.items[i];
        long v = imaplist_find(&lr.vidx, it->key);
        int children = imaplist_below(&lr.vidx, it->key);

        buf_reset(&flags);
        if (v < 0)
            imaplist_addflag(&flags, extended ? "\\NonExistent"
                                              : "\\Noselect");
        if (v >= 0 || children)
            imaplist_addflag(&flags, children ? "\\HasChildren"
                                              : "\\HasNoChildren");
        if (want_subs && imaplist_find(&lr.sidx, it->key) >= 0)
            imaplist_addflag(&flags, "\\Subscribed");
        if (v >= 0)
            imaplist_addflag(&flags, lr.uses.data[v]);
        imaplist_line(ls, "LIST", buf_cstring(&flags), it->ext,
                      it->childinfo ? "(\"CHILDINFO\" (\"SUBSCRIBED\"))"
                                    : NULL);
        if (v >= 0 && (opt->ret & IMAPPARSE_LRET_STATUS))
            (void)ls->status(ls->rock, it->ext, lr.names.data[v],
                             &opt->status);
        if (v >= 0 && (opt->ret & IMAPPARSE_LRET_MYRIGHTS) && ls->myrights)
            ls->myrights(ls->rock, it->ext, lr.names.data[v],
                         lr.acls.data[v]);
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

/*
 * mbtool - the mailbox administration tool.
 *
 *   mbtool [-C imapd.conf] COMMAND [ARGS]
 *
 * Creates, deletes, renames and lists mailboxes, sets ACLs and quotas,
 * checks and reconstructs indexes, removes expunged messages, prunes the
 * duplicate database, and delivers a message file into mailboxes (like
 * Cyrus's deliver), so that an admin, the demo and the tests can set
 * users up without IMAP.  Every command goes through the store's public
 * interfaces (the store headers); nothing here touches files directly.
 *
 * Started as root it becomes cyrus_user first (lib/privs.c), as the
 * master does, so that what it creates is the server's.
 *
 * Exit status: 0 success, 1 the operation failed (message on stderr),
 * 2 usage error, 3 delivery: some recipients failed temporarily,
 * 4 delivery: some failed permanently (when both, 3).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"
#include "lib/strarray.h"
#include "store/journal.h"
#include "store/acl.h"
#include "store/append.h"
#include "store/deliver.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/seen.h"
#include "store/store.h"
#include "store/subs.h"
#include "store/sievedir.h"
#include "store/userid.h"
#include "sieve/sieve.h"
#include "tools/mbtool_xfer.h"

#define MBTOOL_DEFAULT_CONFIG IMAPCONF_DEFAULT_PATH
#define MBTOOL_EXIT_OK 0
#define MBTOOL_EXIT_FAIL 1
#define MBTOOL_EXIT_USAGE 2
#define MBTOOL_EXIT_TEMPFAIL 3
#define MBTOOL_EXIT_PERMFAIL 4

static const char *mbtool_progname = "mbtool";
static const struct imapconf *mbtool_conf;
static struct userid_policy mbtool_policy;
static struct strarray mbtool_converted = STRARRAY_INITIALIZER;

static void mbtool_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] COMMAND [ARGS]\n"
"\n"
"Mailbox administration.  Names are internal (user.alice, user.alice.Sent,\n"
"shared.news); a user's INBOX is user.USER.  With virtdomains, a name of\n"
"a domain is example.com!user.alice, or written as IMAP shows it to a\n"
"global admin: user/alice@example.com (user.alice@example.com with '.' as\n"
"the separator); NAME@DEFAULTDOMAIN is the domain-less NAME.  A USER of\n"
"deliver may be alice@example.com.\n"
"\n"
"  create NAME [PARTITION]       create a mailbox (owner ACL for user.*)\n"
"  delete [-r] NAME              delete it (-r: with every mailbox below)\n"
"  rename OLD NEW [PARTITION]    rename a mailbox and the ones below it\n"
"  undelete NAME [NEWNAME]       restore a mailbox deleted with delete_mode:\n"
"                                delayed (NAME: its DELETED.NAME.HEXTIME,\n"
"                                or the old name: the latest deletion) as\n"
"                                NEWNAME (default: its old name); list\n"
"                                them with: list 'DELETED.*'\n"
"  list [-d DOMAIN] [PATTERN]    list mailboxes (IMAP pattern, default *):\n"
"                                name, partition, messages, uidnext;\n"
"                                -d: only DOMAIN's (PATTERN within it)\n"
"  domains                       the virtual domains that have mailboxes,\n"
"                                with their number of mailboxes\n"
"  delete-domain DOMAIN          delete every mailbox of DOMAIN, its\n"
"                                quota roots and its users' seen and\n"
"                                subscription files\n"
"  info NAME                     the list entry and the index header\n"
"  setacl NAME ID RIGHTS         set ID's rights (letters lrswipkxtea;\n"
"                                \"none\" removes the entry)\n"
"  quota set ROOT STORAGE_KB MESSAGES\n"
"                                create or change a quota root (\"none\" =\n"
"                                no limit); usage is computed from the\n"
"                                mailboxes it covers\n"
"  quota show [ROOT]             limits and usage of one or every root\n"
"  quota remove ROOT             remove a quota root\n"
"  check [-r] NAME | -a          verify an index (-r: and the ones below;\n"
"                                -a: every mailbox's)\n"
"  reconstruct [-r] NAME | -a    rebuild an index from the message files\n"
"  cleanup [-r] NAME | -a        remove expunged messages for good\n"
"                                (-r: below NAME too; -a: every mailbox)\n"
"  prune DAYS                    drop duplicate records older than DAYS\n"
"  stage-cleanup [PARTITION]     remove staging files of delivery processes\n"
"                                that are gone (or older than a day)\n"
"  sieve list USER               USER's Sieve scripts (the active one\n"
"                                marked \"active\") and their directory\n"
"  sieve put USER NAME [FILE]    store FILE (default stdin) as script NAME\n"
"                                after checking that it compiles\n"
"  sieve get USER NAME           print script NAME\n"
"  sieve activate USER NAME      make NAME the active script\n"
"  sieve deactivate USER         no active script\n"
"  sieve delete USER NAME        delete script NAME (not the active one)\n"
"  sieve compile [USER]          store again every compiled form (NAME.bc)\n"
"                                that is missing, stale or damaged, of\n"
"                                USER's scripts or of every user's\n"
"  user-dump [-n] USER           mark USER moving (-n: do not) and write\n"
"                                all of USER to stdout (cyr_user move)\n"
"  user-load USER                create USER from a dump on stdin\n"
"  user-mark USER here|moving|moved BACKEND\n"
"                                set USER's move mark (451 at RCPT, no\n"
"                                IMAP login while not \"here\")\n"
"  user-purge [-s STAMP] USER    remove all of USER but the mark (-s: only\n"
"                                if unchanged since the dump of STAMP)\n"
"  user-stamp USER               the stamp of USER's mailboxes\n"
"  journal-replay [PARTITION]    redo the delivery journal of PARTITION (or\n"
"                                of every partition) after a power loss;\n"
"                                only while no delivery runs\n"
"  deliver [-q] [-D] [-m FOLDER] [-M MAILBOX] [-f FILE] [USER...]\n"
"                                deliver a message (FILE or stdin, LF or\n"
"                                CRLF lines) to each USER's INBOX (or its\n"
"                                FOLDER, when that exists) and to MAILBOX;\n"
"                                -q ignores quota, -D skips duplicate\n"
"                                suppression\n"
"\n"
"  -C FILE   the imapd.conf (default %s)\n"
"  -h, --help  this text\n"
"Started as root, mbtool becomes cyrus_user (imapd.conf, default cyrus)\n"
"first, as the master does, so that what it creates is the server's.\n"
"Exit status: 0 done, 1 failed, 2 usage; deliver: 3 some recipient failed\n"
"temporarily, 4 some failed permanently.\n",
            mbtool_progname, MBTOOL_DEFAULT_CONFIG);
}

static int mbtool_usage_error(const char *what)
{
    fprintf(stderr, "%s: %s\nTry '%s -h' for more information.\n",
            mbtool_progname, what, mbtool_progname);
    return MBTOOL_EXIT_USAGE;
}

static int mbtool_fail(const char *what, const char *name, int r)
{
    fprintf(stderr, "%s: %s %s: %s\n", mbtool_progname, what,
            name ? name : "", store_strerror(r));
    return MBTOOL_EXIT_FAIL;
}

static int mbtool_open_list(struct mboxlist **ml_r)
{
    int r = mboxlist_open(mbtool_conf, ml_r);

    if (r)
        mbtool_fail("cannot open the mailbox list", NULL, r);
    return r;
}

/* Parse a non-negative decimal or "none" (-1). */
static int mbtool_parse_limit(const char *s, long long *out)
{
    char *end;
    long long v;

    if (strcmp(s, "none") == 0) {
        *out = QUOTA_UNLIMITED;
        return 0;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0 || s[0] == '-' || s[0] == '+')
        return -1;
    *out = v;
    return 0;
}

/* ---- names ---- */

/* A NAME argument into the internal form, in place (*arg then points at
 * memory kept until exit): "D!..." and plain names are internal already;
 * with virtdomains, "NAME@D" is read as a global admin's IMAP name ('/'
 * as the separator when the name has one, else the configured one), and
 * NAME@DEFAULTDOMAIN is the domain-less NAME.  0, or -1 (said why). */
static int mbtool_name(char **arg)
{
    struct buf out = BUF_INITIALIZER;
    const char *err = NULL, *domain, *rest;
    size_t dlen;
    int unixsep;

    if (strchr(*arg, '!') ||
        mbtool_policy.virtdomains == USERID_VIRTDOMAINS_OFF ||
        !strchr(*arg, '@'))
        return 0;
    unixsep = strchr(*arg, '/') ? 1
              : imapconf_getswitch(mbtool_conf, "unixhierarchysep");
    if (mboxname_to_internal_for(*arg, unixsep, NULL, 1, &out, &err) !=
        STORE_OK) {
        fprintf(stderr, "%s: bad mailbox name \"%s\": %s\n", mbtool_progname,
                *arg, err ? err : "out of memory");
        buf_free(&out);
        return -1;
    }
    domain = mboxname_domain(buf_cstring(&out), &dlen, &rest);
    if (domain && strlen(mbtool_policy.defaultdomain) == dlen &&
        memcmp(domain, mbtool_policy.defaultdomain, dlen) == 0)
        strarray_append(&mbtool_converted, rest);
    else
        strarray_append(&mbtool_converted, buf_cstring(&out));
    buf_free(&out);
    *arg = mbtool_converted.data[mbtool_converted.count - 1];
    return 0;
}

/* A DOMAIN argument: valid, lower-cased, into out.  0 or -1 (said). */
static int mbtool_domain(const char *arg, struct buf *out)
{
    const char *err = NULL;

    if (mboxname_domain_check(arg, strlen(arg), out, &err) != STORE_OK) {
        fprintf(stderr, "%s: bad domain \"%s\": %s\n", mbtool_progname, arg,
                err ? err : "out of memory");
        return -1;
    }
    return 0;
}

/* ---- create / delete / rename / setacl ---- */

static int mbtool_create(int argc, char **argv)
{
    struct mboxlist *ml;
    struct buf uid = BUF_INITIALIZER;
    int r;

    if (argc < 2 || argc > 3)
        return mbtool_usage_error("create NAME [PARTITION]");
    if (mbtool_name(&argv[1]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    r = mboxlist_create(ml, argv[1], argc == 3 ? argv[2] : NULL, NULL, &uid);
    mboxlist_close(&ml);
    if (r) {
        buf_free(&uid);
        return mbtool_fail("cannot create", argv[1], r);
    }
    printf("%s: created uniqueid=%s\n", argv[1], buf_cstring(&uid));
    buf_free(&uid);
    return MBTOOL_EXIT_OK;
}

static int mbtool_delete(int argc, char **argv)
{
    struct mboxlist *ml;
    int flags = 0, r;

    if (argc == 3 && strcmp(argv[1], "-r") == 0) {
        flags = MBOXLIST_RECURSIVE;
        argv++;
        argc--;
    }
    if (argc != 2)
        return mbtool_usage_error("delete [-r] NAME");
    if (mbtool_name(&argv[1]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    r = mboxlist_delete(ml, argv[1], flags);
    mboxlist_close(&ml);
    if (r)
        return mbtool_fail("cannot delete", argv[1], r);
    printf("%s: deleted\n", argv[1]);
    return MBTOOL_EXIT_OK;
}

struct mbtool_undelete {
    const char *orig;
    struct buf best;
    time_t best_when;
};

static int mbtool_undelete_cb(void *rock, const struct mboxlist_entry *e)
{
    struct mbtool_undelete *u = rock;
    struct buf orig = BUF_INITIALIZER;
    time_t when;

    if (mboxlist_deleted_parse(e->name, &orig, &when) == STORE_OK &&
        strcmp(buf_cstring(&orig), u->orig) == 0 &&
        (!u->best.len || when >= u->best_when)) {
        buf_setcstr(&u->best, e->name);
        u->best_when = when;
    }
    buf_free(&orig);
    return 0;
}

static int mbtool_undelete(int argc, char **argv)
{
    struct mbtool_undelete u;
    struct buf orig = BUF_INITIALIZER, pat = BUF_INITIALIZER;
    struct mboxlist *ml;
    const char *from, *to;
    int r;

    if (argc < 2 || argc > 3)
        return mbtool_usage_error("undelete NAME [NEWNAME]");
    if (mbtool_name(&argv[1]) || (argc == 3 && mbtool_name(&argv[2])))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    memset(&u, 0, sizeof(u));
    if (mboxlist_deleted_parse(argv[1], &orig, NULL) == STORE_OK) {
        from = argv[1];
        r = STORE_OK;
    } else {
        /* the latest deletion of that name: DELETED.NAME.HEX */
        u.orig = argv[1];
        r = mboxlist_deleted_name(argv[1], 0, &pat);
        if (r == STORE_OK) {
            buf_truncate(&pat, pat.len - 8);        /* the hex time */
            buf_putc(&pat, '%');
            r = mboxlist_list(ml, buf_cstring(&pat), mbtool_undelete_cb,
                              &u);
        }
        if (r == STORE_OK && !u.best.len)
            r = STORE_NOTFOUND;
        from = buf_cstring(&u.best);
        buf_setcstr(&orig, argv[1]);
    }
    to = argc == 3 ? argv[2] : buf_cstring(&orig);
    if (r == STORE_OK)
        r = mboxlist_rename(ml, from, to, NULL);
    mboxlist_close(&ml);
    if (r == STORE_OK)
        printf("%s: restored as %s\n", from, to);
    else
        mbtool_fail("cannot undelete", argv[1], r);
    buf_free(&orig);
    buf_free(&pat);
    buf_free(&u.best);
    return r ? MBTOOL_EXIT_FAIL : MBTOOL_EXIT_OK;
}

static int mbtool_rename(int argc, char **argv)
{
    struct mboxlist *ml;
    int r;

    if (argc < 3 || argc > 4)
        return mbtool_usage_error("rename OLD NEW [PARTITION]");
    if (mbtool_name(&argv[1]) || mbtool_name(&argv[2]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    r = mboxlist_rename(ml, argv[1], argv[2], argc == 4 ? argv[3] : NULL);
    mboxlist_close(&ml);
    if (r)
        return mbtool_fail("cannot rename", argv[1], r);
    printf("%s: renamed to %s\n", argv[1], argv[2]);
    return MBTOOL_EXIT_OK;
}

static int mbtool_setacl(int argc, char **argv)
{
    struct mboxlist *ml;
    struct mboxlist_entry *e = NULL;
    struct buf acl = BUF_INITIALIZER;
    int mask = 0, r;

    if (argc != 4)
        return mbtool_usage_error("setacl NAME ID RIGHTS");
    if (strcmp(argv[3], "none") != 0 && acl_parse_rights(argv[3], &mask) != 0) {
        fprintf(stderr, "%s: unknown rights letters \"%s\" (use lrswipkxtea)\n",
                mbtool_progname, argv[3]);
        return MBTOOL_EXIT_USAGE;
    }
    if (mbtool_name(&argv[1]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    r = mboxlist_lookup(ml, argv[1], &e);
    if (r == STORE_OK && acl_set(e->acl, argv[2], mask, &acl) != 0) {
        fprintf(stderr, "%s: bad identifier \"%s\"\n", mbtool_progname, argv[2]);
        mboxlist_entry_free(&e);
        mboxlist_close(&ml);
        buf_free(&acl);
        return MBTOOL_EXIT_FAIL;
    }
    if (r == STORE_OK)
        r = mboxlist_setacl(ml, argv[1], buf_cstring(&acl));
    mboxlist_entry_free(&e);
    mboxlist_close(&ml);
    buf_free(&acl);
    if (r)
        return mbtool_fail("cannot set the ACL of", argv[1], r);
    printf("%s: acl set\n", argv[1]);
    return MBTOOL_EXIT_OK;
}

/* ---- list / info ---- */

static void mbtool_print_acl(const char *acl)
{
    const char *p = acl, *tab;
    int first = 1;

    /* "id\trights\t..." shown as "id=rights id=rights" */
    while (*p) {
        tab = strchr(p, '\t');
        if (!tab)
            break;
        printf("%s%.*s=", first ? "" : " ", (int)(tab - p), p);
        p = tab + 1;
        tab = strchr(p, '\t');
        if (!tab)
            break;
        printf("%.*s", (int)(tab - p), p);
        p = tab + 1;
        first = 0;
    }
}

static int mbtool_list_cb(void *rock, const struct mboxlist_entry *e)
{
    struct mailbox *mb = NULL;
    int r;

    (void)rock;
    r = mailbox_open(mbtool_conf, e->name, e->partition, &mb);
    if (r == STORE_OK)
        r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        const struct mailbox_header *h = mailbox_get_header(mb);

        printf("%s %s messages=%u uidnext=%u\n", e->name, e->partition,
               h->exists, h->uidnext);
        mailbox_unlock(mb);
    } else {
        printf("%s %s (index: %s)\n", e->name, e->partition,
               store_strerror(r));
    }
    if (mb)
        mailbox_close(&mb);
    return 0;
}

static int mbtool_list(int argc, char **argv)
{
    struct mboxlist *ml;
    struct buf pat = BUF_INITIALIZER;
    int r;

    if (argc >= 3 && strcmp(argv[1], "-d") == 0) {
        /* "DOMAIN!PATTERN": a pattern never crosses the '!' */
        if (mbtool_domain(argv[2], &pat))
            return MBTOOL_EXIT_FAIL;
        buf_putc(&pat, '!');
        argv += 2;
        argc -= 2;
    }
    if (argc > 2) {
        buf_free(&pat);
        return mbtool_usage_error("list [-d DOMAIN] [PATTERN]");
    }
    buf_appendcstr(&pat, argc == 2 ? argv[1] : "*");
    if (mbtool_open_list(&ml)) {
        buf_free(&pat);
        return MBTOOL_EXIT_FAIL;
    }
    r = mboxlist_list(ml, buf_cstring(&pat), mbtool_list_cb, NULL);
    mboxlist_close(&ml);
    buf_free(&pat);
    if (r)
        return mbtool_fail("cannot list", NULL, r);
    return MBTOOL_EXIT_OK;
}

static int mbtool_info(int argc, char **argv)
{
    struct mboxlist *ml;
    struct mboxlist_entry *e = NULL;
    struct mailbox *mb = NULL;
    int r;

    if (argc != 2)
        return mbtool_usage_error("info NAME");
    if (mbtool_name(&argv[1]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    r = mboxlist_lookup(ml, argv[1], &e);
    mboxlist_close(&ml);
    if (r)
        return mbtool_fail("no mailbox", argv[1], r);
    printf("name: %s\npartition: %s\nuniqueid: %s\ntype: %c\nacl: ",
           e->name, e->partition, e->uniqueid, e->type);
    mbtool_print_acl(e->acl);
    printf("\n");
    if (e->specialuse[0])
        printf("specialuse: %s\n", e->specialuse);
    r = mailbox_open(mbtool_conf, e->name, e->partition, &mb);
    if (r == STORE_OK)
        r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        const struct mailbox_header *h = mailbox_get_header(mb);

        printf("directory: %s\nuidvalidity: %u\nuidnext: %u\nmessages: %u\n"
               "records: %u\nhighestmodseq: %llu\nquota_used: %llu\n",
               mailbox_dir(mb), h->uidvalidity, h->uidnext, h->exists,
               h->num_records, (unsigned long long)h->highestmodseq,
               (unsigned long long)h->quota_used);
        mailbox_unlock(mb);
    }
    if (mb)
        mailbox_close(&mb);
    mboxlist_entry_free(&e);
    if (r)
        return mbtool_fail("cannot read the index of", argv[1], r);
    return MBTOOL_EXIT_OK;
}

/* ---- quota ---- */

struct mbtool_names {
    struct strarray names;
    struct strarray partitions;
};

static int mbtool_collect_cb(void *rock, const struct mboxlist_entry *e)
{
    struct mbtool_names *n = rock;

    strarray_append(&n->names, e->name);
    strarray_append(&n->partitions, e->partition);
    return 0;
}

/* `name` and every mailbox below it, with their partitions. */
static int mbtool_collect_tree(struct mboxlist *ml, const char *name,
                               struct mbtool_names *n)
{
    struct buf pat = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    int r;

    r = mboxlist_lookup(ml, name, &e);
    if (r == STORE_OK) {
        strarray_append(&n->names, e->name);
        strarray_append(&n->partitions, e->partition);
        mboxlist_entry_free(&e);
    } else if (r != STORE_NOTFOUND) {
        return r;
    }
    buf_printf(&pat, "%s.*", name);
    r = mboxlist_list(ml, buf_cstring(&pat), mbtool_collect_cb, n);
    buf_free(&pat);
    return r;
}

/* Bring the quota records of every mailbox below `root` in line with
 * their index headers (taking each one's exclusive lock does that). */
static int mbtool_quota_recount(struct mboxlist *ml, const char *root)
{
    struct mbtool_names n = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct mailbox *mb;
    size_t i;
    int r;

    r = mbtool_collect_tree(ml, root, &n);
    for (i = 0; r == STORE_OK && i < n.names.count; i++) {
        mb = NULL;
        r = mailbox_open(mbtool_conf, n.names.data[i], n.partitions.data[i], &mb);
        if (r == STORE_OK)
            r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
        if (r == STORE_OK)
            r = mailbox_unlock(mb);
        if (mb)
            mailbox_close(&mb);
        if (r)
            mbtool_fail("cannot count the usage of", n.names.data[i], r);
    }
    strarray_fini(&n.names);
    strarray_fini(&n.partitions);
    return r;
}

static void mbtool_print_quota(const char *root, const struct quota *q)
{
    printf("%s", root);
    if (q->storage_limit_kb == QUOTA_UNLIMITED)
        printf(" storage=%llu KiB (no limit)",
               (unsigned long long)((q->used_bytes + 1023) / 1024));
    else
        printf(" storage=%llu/%lld KiB",
               (unsigned long long)((q->used_bytes + 1023) / 1024),
               q->storage_limit_kb);
    if (q->message_limit == QUOTA_UNLIMITED)
        printf(" messages=%llu (no limit)\n",
               (unsigned long long)q->used_messages);
    else
        printf(" messages=%llu/%lld\n", (unsigned long long)q->used_messages,
               q->message_limit);
}

static int mbtool_quota_show_cb(void *rock, const struct mboxlist_entry *e)
{
    struct quota_db *qdb = rock;
    struct quota q;

    if (quota_get(qdb, e->name, &q) == STORE_OK)
        mbtool_print_quota(e->name, &q);
    return 0;
}

static int mbtool_quota(int argc, char **argv)
{
    struct quota_db *qdb = NULL;
    struct mboxlist *ml = NULL;
    struct quota q;
    long long storage, messages;
    int r;

    if (argc < 2)
        return mbtool_usage_error("quota set|show|remove ...");
    if (strcmp(argv[1], "set") == 0) {
        if (argc != 5)
            return mbtool_usage_error("quota set ROOT STORAGE_KB MESSAGES");
        if (mbtool_parse_limit(argv[3], &storage) ||
            mbtool_parse_limit(argv[4], &messages))
            return mbtool_usage_error("limits are numbers or \"none\"");
    } else if (strcmp(argv[1], "show") == 0) {
        if (argc > 3)
            return mbtool_usage_error("quota show [ROOT]");
    } else if (strcmp(argv[1], "remove") == 0) {
        if (argc != 3)
            return mbtool_usage_error("quota remove ROOT");
    } else {
        return mbtool_usage_error("quota set|show|remove ...");
    }
    if (argc >= 3 && mbtool_name(&argv[2]))
        return MBTOOL_EXIT_FAIL;

    r = quota_open(mbtool_conf, &qdb);
    if (r)
        return mbtool_fail("cannot open the quota database", NULL, r);
    if (strcmp(argv[1], "set") == 0) {
        r = mboxname_check(argv[2], NULL);
        if (r == STORE_OK)
            r = quota_set(qdb, argv[2], storage, messages);
        quota_close(&qdb);
        if (r)
            return mbtool_fail("cannot set quota", argv[2], r);
        if (mbtool_open_list(&ml))
            return MBTOOL_EXIT_FAIL;
        r = mbtool_quota_recount(ml, argv[2]);
        mboxlist_close(&ml);
        if (r)
            return MBTOOL_EXIT_FAIL;
        if ((r = quota_open(mbtool_conf, &qdb)) == STORE_OK) {
            r = quota_get(qdb, argv[2], &q);
            if (r == STORE_OK)
                mbtool_print_quota(argv[2], &q);
            quota_close(&qdb);
        }
        return r ? mbtool_fail("cannot read quota", argv[2], r) : MBTOOL_EXIT_OK;
    }
    if (strcmp(argv[1], "remove") == 0) {
        r = quota_remove(qdb, argv[2]);
        quota_close(&qdb);
        if (r)
            return mbtool_fail("cannot remove quota", argv[2], r);
        printf("%s: quota removed\n", argv[2]);
        return MBTOOL_EXIT_OK;
    }
    if (argc == 3) {
        r = quota_get(qdb, argv[2], &q);
        if (r == STORE_OK)
            mbtool_print_quota(argv[2], &q);
        quota_close(&qdb);
        return r ? mbtool_fail("no quota root", argv[2], r) : MBTOOL_EXIT_OK;
    }
    /* every root: quota roots are mailbox names, so walk the list */
    if (mbtool_open_list(&ml)) {
        quota_close(&qdb);
        return MBTOOL_EXIT_FAIL;
    }
    r = mboxlist_list(ml, "*", mbtool_quota_show_cb, qdb);
    mboxlist_close(&ml);
    quota_close(&qdb);
    return r ? mbtool_fail("cannot list", NULL, r) : MBTOOL_EXIT_OK;
}

/* ---- domains ---- */

struct mbtool_domains {
    struct strarray names;      /* distinct, in list order (sorted) */
    unsigned long *count;       /* mailboxes of each, grown with names */
    size_t alloc;
};

static int mbtool_domains_cb(void *rock, const struct mboxlist_entry *e)
{
    struct mbtool_domains *d = rock;
    const char *dom;
    size_t dlen, n = d->names.count;

    dom = mboxname_domain(e->name, &dlen, NULL);
    if (!dom)
        return 0;
    if (n > 0 && strlen(d->names.data[n - 1]) == dlen &&
        memcmp(d->names.data[n - 1], dom, dlen) == 0) {
        d->count[n - 1]++;
        return 0;
    }
    if (n == d->alloc) {
        size_t na = d->alloc ? d->alloc * 2 : 16;
        unsigned long *nc = realloc(d->count, na * sizeof(*nc));

        if (!nc)
            return STORE_NOMEM;
        d->count = nc;
        d->alloc = na;
    }
    {
        char *copy = strndup(dom, dlen);

        if (!copy)
            return STORE_NOMEM;
        strarray_append(&d->names, copy);
        free(copy);
    }
    d->count[n] = 1;
    return 0;
}

static int mbtool_domains(int argc, char **argv)
{
    struct mbtool_domains d;
    struct mboxlist *ml;
    size_t i;
    int r;

    (void)argv;
    if (argc != 1)
        return mbtool_usage_error("domains");
    memset(&d, 0, sizeof(d));
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    /* the list is sorted by name, so a domain's names are adjacent */
    r = mboxlist_list(ml, "*", mbtool_domains_cb, &d);
    mboxlist_close(&ml);
    for (i = 0; r == STORE_OK && i < d.names.count; i++)
        printf("%s mailboxes=%lu\n", d.names.data[i], d.count[i]);
    strarray_fini(&d.names);
    free(d.count);
    if (r)
        return mbtool_fail("cannot list", NULL, r);
    return MBTOOL_EXIT_OK;
}

/* Remove the empty directories of the tree at path (best effort);
 * 1 when path itself is gone. */
static int mbtool_rmdir_empty(const char *path)
{
    DIR *dir = opendir(path);
    struct dirent *de;
    struct buf sub = BUF_INITIALIZER;

    if (!dir)
        return errno == ENOENT;
    while ((de = readdir(dir)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        buf_reset(&sub);
        buf_printf(&sub, "%s/%s", path, de->d_name);
        (void)mbtool_rmdir_empty(buf_cstring(&sub));
    }
    closedir(dir);
    buf_free(&sub);
    return rmdir(path) == 0;
}

static int mbtool_delete_domain(int argc, char **argv)
{
    struct mbtool_names n = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct buf dom = BUF_INITIALIZER, pat = BUF_INITIALIZER;
    struct buf path = BUF_INITIALIZER, uid = BUF_INITIALIZER;
    struct quota_db *qdb = NULL;
    struct mboxlist *ml;
    unsigned long deleted = 0, roots = 0, users = 0;
    size_t i;
    int r = STORE_OK, failed = 0;

    if (argc != 2)
        return mbtool_usage_error("delete-domain DOMAIN");
    if (mbtool_domain(argv[1], &dom))
        return MBTOOL_EXIT_FAIL;
    buf_printf(&pat, "%s!*", buf_cstring(&dom));
    if (mbtool_open_list(&ml)) {
        buf_free(&dom);
        buf_free(&pat);
        return MBTOOL_EXIT_FAIL;
    }
    r = mboxlist_list(ml, buf_cstring(&pat), mbtool_collect_cb, &n);
    if (r) {
        mboxlist_close(&ml);
        failed = 1;
        mbtool_fail("cannot list", buf_cstring(&pat), r);
        goto out;
    }
    r = quota_open(mbtool_conf, &qdb);
    if (r) {
        mboxlist_close(&ml);
        failed = 1;
        mbtool_fail("cannot open the quota database", NULL, r);
        goto out;
    }
    /* deepest first: children before their parents */
    for (i = n.names.count; i-- > 0;) {
        const char *name = n.names.data[i];

        r = mboxlist_delete(ml, name, 0);
        if (r && r != STORE_NOTFOUND) {
            mbtool_fail("cannot delete", name, r);
            failed = 1;
            continue;
        }
        deleted++;
        r = quota_remove(qdb, name);
        if (r == STORE_OK)
            roots++;
        else if (r != STORE_NOTFOUND) {
            mbtool_fail("cannot remove the quota root", name, r);
            failed = 1;
        }
        /* the seen state and subscriptions of the domain's users */
        if (mboxname_userid(name, &uid)) {
            size_t k;
            int r1, r2;

            for (k = 0; k < uid.len; k++)
                if (uid.s[k] == '^')
                    uid.s[k] = '.';
            r1 = seen_delete_user(mbtool_conf, buf_cstring(&uid));
            r2 = subs_delete_user(mbtool_conf, buf_cstring(&uid));
            if (r1 == STORE_OK || r2 == STORE_OK)
                users++;
            if ((r1 != STORE_OK && r1 != STORE_NOTFOUND) ||
                (r2 != STORE_OK && r2 != STORE_NOTFOUND)) {
                mbtool_fail("cannot remove the seen state or subscriptions "
                            "of", buf_cstring(&uid),
                            r1 != STORE_OK && r1 != STORE_NOTFOUND ? r1 : r2);
                failed = 1;
            }
        }
    }
    quota_close(&qdb);
    mboxlist_close(&ml);
    /* the domain's directories, now empty: per-user files and spools */
    buf_printf(&path, "%s/domain/%c/%s",
               imapconf_getstring(mbtool_conf, "configdirectory"),
               mboxname_domain_hash_letter(buf_cstring(&dom)),
               buf_cstring(&dom));
    (void)mbtool_rmdir_empty(buf_cstring(&path));
    for (i = 0; i < n.partitions.count; i++) {
        const char *root = imapconf_partition(mbtool_conf,
                                              n.partitions.data[i]);
        int h;

        for (h = 0; root && h <= 1; h++) {
            buf_reset(&path);
            if (h)
                buf_printf(&path, "%s/domain/%c/%s", root,
                           mboxname_domain_hash_letter(buf_cstring(&dom)),
                           buf_cstring(&dom));
            else
                buf_printf(&path, "%s/domain/%s", root, buf_cstring(&dom));
            (void)mbtool_rmdir_empty(buf_cstring(&path));
        }
    }
    printf("%s: domain deleted mailboxes=%lu quota_roots=%lu users=%lu\n",
           buf_cstring(&dom), deleted, roots, users);

out:
    strarray_fini(&n.names);
    strarray_fini(&n.partitions);
    buf_free(&dom);
    buf_free(&pat);
    buf_free(&path);
    buf_free(&uid);
    return failed ? MBTOOL_EXIT_FAIL : MBTOOL_EXIT_OK;
}

/* ---- check / reconstruct / cleanup ---- */

static int mbtool_tree_op(int argc, char **argv, const char *usage,
                          int (*op)(const char *name, const char *part))
{
    struct mbtool_names n = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct mboxlist *ml;
    struct mboxlist_entry *e = NULL;
    int recursive = 0, all = 0, r, failed = 0;
    size_t i;

    if (argc == 2 && strcmp(argv[1], "-a") == 0)
        all = 1;
    else if (argc == 3 && strcmp(argv[1], "-r") == 0) {
        recursive = 1;
        argv++;
        argc--;
    }
    if (argc != 2)
        return mbtool_usage_error(usage);
    if (!all && mbtool_name(&argv[1]))
        return MBTOOL_EXIT_FAIL;
    if (mbtool_open_list(&ml))
        return MBTOOL_EXIT_FAIL;
    if (all) {
        r = mboxlist_list(ml, "*", mbtool_collect_cb, &n);
    } else if (recursive) {
        r = mbtool_collect_tree(ml, argv[1], &n);
    } else {
        r = mboxlist_lookup(ml, argv[1], &e);
        if (r == STORE_OK) {
            strarray_append(&n.names, e->name);
            strarray_append(&n.partitions, e->partition);
            mboxlist_entry_free(&e);
        }
    }
    mboxlist_close(&ml);
    if (r == STORE_OK && n.names.count == 0 && !all)
        r = STORE_NOTFOUND;
    if (r) {
        strarray_fini(&n.names);
        strarray_fini(&n.partitions);
        return mbtool_fail(all ? "cannot list the mailboxes" : "no mailbox",
                           all ? NULL : argv[1], r);
    }
    for (i = 0; i < n.names.count; i++)
        if (op(n.names.data[i], n.partitions.data[i]) != 0)
            failed = 1;
    strarray_fini(&n.names);
    strarray_fini(&n.partitions);
    return failed ? MBTOOL_EXIT_FAIL : MBTOOL_EXIT_OK;
}

static int mbtool_check_one(const char *name, const char *part)
{
    struct buf problem = BUF_INITIALIZER;
    struct mailbox *mb = NULL;
    int r;

    r = mailbox_open(mbtool_conf, name, part, &mb);
    if (r == STORE_OK) {
        r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
        if (r == STORE_OK) {
            r = mailbox_check(mb, &problem);
            mailbox_unlock(mb);
        }
        mailbox_close(&mb);
    }
    if (r == STORE_OK)
        printf("%s: ok\n", name);
    else
        printf("%s: %s%s%s\n", name, store_strerror(r),
               problem.len ? ": " : "", buf_cstring(&problem));
    buf_free(&problem);
    return r;
}

static int mbtool_reconstruct_one(const char *name, const char *part)
{
    struct mboxlist *ml;
    struct mboxlist_entry *e = NULL;
    struct buf report = BUF_INITIALIZER;
    int r;

    r = mboxlist_open(mbtool_conf, &ml);
    if (r == STORE_OK) {
        r = mboxlist_lookup(ml, name, &e);
        mboxlist_close(&ml);
    }
    if (r == STORE_OK)
        r = mailbox_reconstruct(mbtool_conf, name, part, e->uniqueid, &report);
    mboxlist_entry_free(&e);
    if (r == STORE_OK)
        printf("%s: reconstructed: %s\n", name, buf_cstring(&report));
    else
        fprintf(stderr, "%s: cannot reconstruct %s: %s\n", mbtool_progname,
                name, store_strerror(r));
    buf_free(&report);
    return r;
}

static int mbtool_cleanup_one(const char *name, const char *part)
{
    struct mailbox *mb = NULL;
    int r, r2;

    r = mailbox_open(mbtool_conf, name, part, &mb);
    if (r == STORE_OK) {
        r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
        if (r == STORE_OK) {
            r = mailbox_cleanup(mb);
            r2 = mailbox_unlock(mb);
            if (!r)
                r = r2;
        }
        mailbox_close(&mb);
    }
    if (r == STORE_OK)
        printf("%s: cleaned up\n", name);
    else
        fprintf(stderr, "%s: cannot clean up %s: %s\n", mbtool_progname,
                name, store_strerror(r));
    return r;
}

/* ---- prune ---- */

static int mbtool_prune(int argc, char **argv)
{
    struct duplicate_db *d;
    unsigned long pruned = 0, kept = 0;
    long long days;
    int r;

    if (argc != 2 || mbtool_parse_limit(argv[1], &days) || days < 0 ||
        days > 100000)
        return mbtool_usage_error("prune DAYS");
    r = duplicate_open(mbtool_conf, &d);
    if (r)
        return mbtool_fail("cannot open the duplicate database", NULL, r);
    r = duplicate_prune(d, (int)days, &pruned, &kept);
    duplicate_close(&d);
    if (r)
        return mbtool_fail("cannot prune", NULL, r);
    printf("duplicate records: %lu pruned, %lu kept\n", pruned, kept);
    return MBTOOL_EXIT_OK;
}

/* ---- stage-cleanup ---- */

#define MBTOOL_STAGE_MAX_AGE 86400L

static int mbtool_stage_cleanup(int argc, char **argv)
{
    unsigned long removed = 0;
    int r;

    if (argc > 2)
        return mbtool_usage_error("stage-cleanup [PARTITION]");
    r = append_stage_cleanup(mbtool_conf, argc == 2 ? argv[1] : NULL,
                             MBTOOL_STAGE_MAX_AGE, &removed);
    if (r)
        return mbtool_fail("cannot clean the staging directories of",
                           argc == 2 ? argv[1] : "the default partition", r);
    printf("staging files removed: %lu\n", removed);
    return MBTOOL_EXIT_OK;
}

/* ---- journal-replay ---- */

static int mbtool_journal_replay(int argc, char **argv)
{
    struct journal_replay_stats st;
    int r;

    if (argc > 2)
        return mbtool_usage_error("journal-replay [PARTITION]");
    r = argc == 2 ? journal_replay(mbtool_conf, argv[1], &st)
                  : journal_replay_all(mbtool_conf, &st);
    if (r)
        return mbtool_fail("cannot replay the journal of",
                           argc == 2 ? argv[1] : "every partition", r);
    printf("journal records: %lu entries: %lu files restored: %lu "
           "index records restored: %lu reconstructed: %lu skipped: %lu "
           "failed: %lu\n", st.records, st.entries, st.files_written,
           st.records_added, st.reconstructs, st.skipped, st.failed);
    return st.failed ? MBTOOL_EXIT_FAIL : MBTOOL_EXIT_OK;
}

/* ---- deliver ---- */

/* Read all of `in` into b. */
static int mbtool_read_all(FILE *in, struct buf *b)
{
    char chunk[65536];
    size_t n;

    while ((n = fread(chunk, 1, sizeof(chunk), in)) > 0)
        if (buf_append(b, chunk, n) != 0)
            return -1;
    return ferror(in) ? -1 : 0;
}

/* Stage msg with CRLF line ends (a bare LF becomes CRLF). */
static int mbtool_stage(const struct buf *msg, struct append_stage *st)
{
    size_t i, start = 0;
    int r;

    for (i = 0; i < msg->len; i++) {
        if (msg->s[i] != '\n' || (i > 0 && msg->s[i - 1] == '\r'))
            continue;
        if ((r = append_stage_write(st, msg->s + start, i - start)) ||
            (r = append_stage_write(st, "\r\n", 2)))
            return r;
        start = i + 1;
    }
    if (start < msg->len &&
        (r = append_stage_write(st, msg->s + start, msg->len - start)))
        return r;
    return append_stage_close(st);
}

static int mbtool_deliver(int argc, char **argv)
{
    struct strarray targets = STRARRAY_INITIALIZER;
    struct buf msg = BUF_INITIALIZER, id = BUF_INITIALIZER, name = BUF_INITIALIZER;
    struct deliver_rcpt *rcpts = NULL;
    struct deliver_ctx *ctx = NULL;
    struct append_stage *st = NULL;
    struct mboxlist *ml = NULL;
    struct mboxlist_entry *e = NULL;
    const char *file = NULL, *folder = NULL;
    FILE *in = stdin;
    int flags = 0, opt, r, ret = MBTOOL_EXIT_OK, temp = 0, perm = 0;
    size_t i;

    optind = 1;
    while ((opt = getopt(argc, argv, "qDm:M:f:")) != -1) {
        switch (opt) {
        case 'q': flags |= DELIVER_IGNORE_QUOTA; break;
        case 'D': flags |= DELIVER_NO_DUPCHECK; break;
        case 'm': folder = optarg; break;
        case 'M':
            if (mbtool_name(&optarg)) {
                strarray_fini(&targets);
                return MBTOOL_EXIT_FAIL;
            }
            strarray_append(&targets, optarg);
            break;
        case 'f': file = optarg; break;
        default:
            strarray_fini(&targets);
            return mbtool_usage_error("deliver [-q] [-D] [-m FOLDER] "
                                      "[-M MAILBOX] [-f FILE] [USER...]");
        }
    }
    if (optind == argc && targets.count == 0) {
        strarray_fini(&targets);
        return mbtool_usage_error("deliver: no recipient");
    }
    if (mbtool_open_list(&ml)) {
        strarray_fini(&targets);
        return MBTOOL_EXIT_FAIL;
    }
    /* USER -> user.USER.FOLDER when that exists, else user.USER;
     * USER@D -> D!user.USER... under virtdomains (userid_canon) */
    for (i = (size_t)optind; i < (size_t)argc; i++) {
        const char *why = NULL;

        r = userid_canon(&mbtool_policy, argv[i], NULL, &name, &why);
        if (r == STORE_OK) {
            struct buf userid = BUF_INITIALIZER;

            buf_setcstr(&userid, buf_cstring(&name));
            r = userid_inbox(buf_cstring(&userid), &name);
            buf_free(&userid);
        }
        if (r) {
            fprintf(stderr, "%s: bad user name \"%s\"%s%s\n",
                    mbtool_progname, argv[i], why ? ": " : "",
                    why ? why : "");
            ret = MBTOOL_EXIT_FAIL;
            continue;
        }
        if (folder) {
            struct buf sub = BUF_INITIALIZER;

            buf_printf(&sub, "%s.%s", buf_cstring(&name), folder);
            if (mboxlist_lookup(ml, buf_cstring(&sub), &e) == STORE_OK) {
                buf_setcstr(&name, buf_cstring(&sub));
                mboxlist_entry_free(&e);
            }
            buf_free(&sub);
        }
        strarray_append(&targets, buf_cstring(&name));
    }
    mboxlist_close(&ml);
    if (ret != MBTOOL_EXIT_OK)
        goto out;

    if (file && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "%s: %s: %s\n", mbtool_progname, file, strerror(errno));
        ret = MBTOOL_EXIT_FAIL;
        goto out;
    }
    r = mbtool_read_all(in, &msg);
    if (file)
        fclose(in);
    if (r) {
        fprintf(stderr, "%s: cannot read the message: %s\n", mbtool_progname,
                strerror(errno ? errno : EIO));
        ret = MBTOOL_EXIT_FAIL;
        goto out;
    }
    deliver_find_msgid(msg.s ? msg.s : "", msg.len, &id);

    r = deliver_ctx_new(mbtool_conf, &ctx);
    if (r == STORE_OK)
        r = append_stage_open(mbtool_conf, NULL, &st);
    if (r == STORE_OK)
        r = mbtool_stage(&msg, st);
    if (r) {
        mbtool_fail("cannot stage the message", NULL, r);
        ret = store_is_temporary(r) ? MBTOOL_EXIT_TEMPFAIL : MBTOOL_EXIT_PERMFAIL;
        goto out;
    }
    rcpts = calloc(targets.count, sizeof(*rcpts));
    if (!rcpts) {
        ret = MBTOOL_EXIT_TEMPFAIL;
        goto out;
    }
    for (i = 0; i < targets.count; i++)
        rcpts[i].mailbox = targets.data[i];
    deliver_message(ctx, st, id.len ? id.s : NULL, id.len, rcpts,
                    targets.count, flags);
    for (i = 0; i < targets.count; i++) {
        if (rcpts[i].result == STORE_OK && rcpts[i].duplicate)
            printf("%s: duplicate, not delivered again\n", rcpts[i].mailbox);
        else if (rcpts[i].result == STORE_OK)
            printf("%s: delivered uid=%u\n", rcpts[i].mailbox, rcpts[i].uid);
        else {
            printf("%s: not delivered: %s\n", rcpts[i].mailbox,
                   store_strerror(rcpts[i].result));
            if (store_is_temporary(rcpts[i].result))
                temp = 1;
            else
                perm = 1;
        }
    }
    ret = temp ? MBTOOL_EXIT_TEMPFAIL : perm ? MBTOOL_EXIT_PERMFAIL : MBTOOL_EXIT_OK;

out:
    free(rcpts);
    if (st)
        append_stage_free(&st);
    if (ctx)
        deliver_ctx_free(&ctx);
    strarray_fini(&targets);
    buf_free(&msg);
    buf_free(&id);
    buf_free(&name);
    return ret;
}

/* ---- sieve: a user's scripts (store/sievedir.h) ------------------------ */

static int mbtool_sieve_fail(const char *what, const char *name, int r)
{
    fprintf(stderr, "%s: sieve %s %s: %s%s%s\n", mbtool_progname, what,
            name ? name : "", sievedir_strerror(r),
            r == SIEVEDIR_IOERROR ? ": " : "",
            r == SIEVEDIR_IOERROR ? strerror(errno) : "");
    return MBTOOL_EXIT_FAIL;
}

static int mbtool_sieve_read(const char *file, struct buf *out)
{
    FILE *f = strcmp(file, "-") == 0 ? stdin : fopen(file, "rb");
    char chunk[8192];
    size_t n;
    int r = 0;

    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", mbtool_progname, file,
                strerror(errno));
        return -1;
    }
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        if (buf_append(out, chunk, n) < 0) {
            fprintf(stderr, "%s: %s: too big\n", mbtool_progname, file);
            r = -1;
            break;
        }
    if (ferror(f)) {
        fprintf(stderr, "%s: %s: %s\n", mbtool_progname, file,
                strerror(errno));
        r = -1;
    }
    if (f != stdin)
        fclose(f);
    return r;
}

/* The limits and extensions lmtpd and timsieved check scripts with
 * (sieve_maxscriptsize, sieve_extensions; allowed empty: all), so that
 * the compiled form stored here is the one they load. */
static void mbtool_sieve_conf(struct sieve_limits *limits,
                              struct strarray *allowed)
{
    const char *keys = imapconf_getstring(mbtool_conf, "sieve_extensions");
    struct strarray words = STRARRAY_INITIALIZER;
    size_t i;

    sieve_limits_default(limits);
    limits->max_script_size =
        (size_t)imapconf_getint(mbtool_conf, "sieve_maxscriptsize") * 1024;
    strarray_fini(allowed);
    if (!keys || !*keys)
        return;
    strarray_split(&words, keys, " \t,");
    for (i = 0; i < words.count; i++)
        if (sieve_extension_supported(words.data[i]) &&
            strarray_find(allowed, words.data[i]) < 0)
            strarray_append(allowed, words.data[i]);
    strarray_append(allowed, "comparator-i;octet");
    strarray_append(allowed, "comparator-i;ascii-casemap");
    strarray_fini(&words);
}

/* sieve compile: each script of a user directory given a current
 * compiled form, as lmtpd would store it at the user's next delivery
 * (an upgrade that changed the format, a restore, a change of
 * sieve_extensions or sieve_maxscriptsize), counted. */
struct mbtool_compile {
    struct sieve_limits limits;
    struct strarray allowed;
    unsigned long dirs, scripts, stored, current, failed;
};

static int mbtool_compile_dir(void *rock, const char *dir)
{
    struct mbtool_compile *mc = rock;
    struct strarray names = STRARRAY_INITIALIZER;
    struct buf err = BUF_INITIALIZER;
    size_t i;
    int r;

    r = sievedir_list(dir, &names, NULL);
    if (r != SIEVEDIR_OK) {
        mbtool_sieve_fail("compile", dir, r);
        mc->failed++;
        goto out;
    }
    mc->dirs++;
    for (i = 0; i < names.count; i++) {
        int stored = 0;

        mc->scripts++;
        buf_reset(&err);
        r = sievedir_ensure_bc(dir, names.data[i], &mc->limits,
                               mc->allowed.count ? &mc->allowed : NULL, 1,
                               &stored, &err);
        if (r == SIEVEDIR_OK) {
            if (stored)
                mc->stored++;
            else
                mc->current++;
            continue;
        }
        mc->failed++;
        fprintf(stderr, "%s: sieve compile %s/%s: %s%s%s\n",
                mbtool_progname, dir, names.data[i],
                r == SIEVEDIR_BADNAME ? "does not compile"
                                      : sievedir_strerror(r),
                err.len ? ": " : "", buf_cstring(&err));
    }
out:
    strarray_fini(&names);
    buf_free(&err);
    return 0;
}

static int mbtool_sieve_compile(const char *user)
{
    struct mbtool_compile mc;
    struct buf dir = BUF_INITIALIZER, u = BUF_INITIALIZER;
    const char *why = NULL;
    int r, ret = MBTOOL_EXIT_OK;

    memset(&mc, 0, sizeof(mc));
    mbtool_sieve_conf(&mc.limits, &mc.allowed);
    if (user) {
        if (userid_canon(&mbtool_policy, user, NULL, &u, &why) != STORE_OK) {
            fprintf(stderr, "%s: invalid user id \"%s\": %s\n",
                    mbtool_progname, user, why ? why : "out of memory");
            ret = MBTOOL_EXIT_FAIL;
            goto out;
        }
        r = sievedir_user_path(mbtool_conf, buf_cstring(&u), &dir);
        if (r != SIEVEDIR_OK) {
            ret = mbtool_sieve_fail("user", buf_cstring(&u), r);
            goto out;
        }
        mbtool_compile_dir(&mc, buf_cstring(&dir));
    } else {
        r = sievedir_foreach_user(mbtool_conf, mbtool_compile_dir, &mc);
        if (r != SIEVEDIR_OK) {
            mbtool_sieve_fail("compile", "", r);
            mc.failed++;
        }
    }
    printf("sieve compile: %lu scripts of %lu users: %lu stored again, "
           "%lu current, %lu failed\n", mc.scripts, mc.dirs, mc.stored,
           mc.current, mc.failed);
    if (mc.failed)
        ret = MBTOOL_EXIT_FAIL;
out:
    strarray_fini(&mc.allowed);
    buf_free(&dir);
    buf_free(&u);
    return ret;
}

static int mbtool_sieve(int argc, char **argv)
{
    static const char usage[] = "sieve list|put|get|activate|deactivate|"
                                "delete USER [NAME] [FILE] | "
                                "sieve compile [USER]";
    struct buf user = BUF_INITIALIZER, dir = BUF_INITIALIZER,
               text = BUF_INITIALIZER;
    const char *sub, *why = NULL, *name = argc > 3 ? argv[3] : NULL;
    struct sieve_limits limits;
    struct strarray allowed = STRARRAY_INITIALIZER;
    int r, ret = MBTOOL_EXIT_OK;

    if (argc >= 2 && strcmp(argv[1], "compile") == 0)
        return argc > 3 ? mbtool_usage_error(usage)
                        : mbtool_sieve_compile(argc == 3 ? argv[2] : NULL);
    if (argc < 3)
        return mbtool_usage_error(usage);
    sub = argv[1];
    if ((strcmp(sub, "list") == 0 || strcmp(sub, "deactivate") == 0)
        ? argc != 3
        : strcmp(sub, "put") == 0 ? (argc != 4 && argc != 5) : argc != 4)
        return mbtool_usage_error(usage);
    if (userid_canon(&mbtool_policy, argv[2], NULL, &user, &why)
        != STORE_OK) {
        fprintf(stderr, "%s: invalid user id \"%s\": %s\n",
                mbtool_progname, argv[2], why ? why : "out of memory");
        return MBTOOL_EXIT_FAIL;
    }
    r = sievedir_user_path(mbtool_conf, buf_cstring(&user), &dir);
    if (r != SIEVEDIR_OK) {
        ret = mbtool_sieve_fail("user", buf_cstring(&user), r);
        goto out;
    }
    if (strcmp(sub, "list") == 0) {
        struct strarray names = STRARRAY_INITIALIZER;
        struct buf active = BUF_INITIALIZER;

        r = sievedir_list(buf_cstring(&dir), &names, &active);
        if (r != SIEVEDIR_OK)
            ret = mbtool_sieve_fail("list", buf_cstring(&dir), r);
        printf("directory: %s\n", buf_cstring(&dir));
        for (size_t i = 0; r == SIEVEDIR_OK && i < names.count; i++)
            printf("%s%s\n", names.data[i],
                   active.len &&
                   strcmp(buf_cstring(&active), names.data[i]) == 0
                   ? " active" : "");
        strarray_fini(&names);
        buf_free(&active);
    } else if (strcmp(sub, "put") == 0) {
        struct sieve_script *script = NULL;
        struct buf err = BUF_INITIALIZER;

        if (mbtool_sieve_read(argc == 5 ? argv[4] : "-", &text) != 0) {
            ret = MBTOOL_EXIT_FAIL;
            goto out;
        }
        mbtool_sieve_conf(&limits, &allowed);
        r = sieve_compile(text.s ? text.s : "", text.len, &limits,
                          allowed.count ? &allowed : NULL, &script, &err);
        if (r != SIEVE_OK) {
            fprintf(stderr, "%s: sieve put %s: %s\n", mbtool_progname,
                    name, err.len ? buf_cstring(&err) : sieve_strerror(r));
            buf_free(&err);
            ret = MBTOOL_EXIT_FAIL;
            goto out;
        }
        buf_free(&err);
        r = sievedir_put(buf_cstring(&dir), name, text.s ? text.s : "",
                         text.len);
        if (r != SIEVEDIR_OK)
            ret = mbtool_sieve_fail("put", name, r);
        /* the compiled form beside it, durable as the text */
        else if ((r = sievedir_store_bc(buf_cstring(&dir), name, script,
                                        text.s, text.len,
                                        allowed.count ? &allowed : NULL,
                                        NULL, 1)) != SIEVEDIR_OK)
            ret = mbtool_sieve_fail("put (compiled form)", name, r);
        sieve_script_free(&script);
    } else if (strcmp(sub, "get") == 0) {
        r = sievedir_get(buf_cstring(&dir), name, 0, &text);
        if (r != SIEVEDIR_OK)
            ret = mbtool_sieve_fail("get", name, r);
        else
            fwrite(text.s ? text.s : "", 1, text.len, stdout);
    } else if (strcmp(sub, "activate") == 0 ||
               strcmp(sub, "deactivate") == 0) {
        r = sievedir_activate(buf_cstring(&dir), name);
        if (r != SIEVEDIR_OK)
            ret = mbtool_sieve_fail(sub, name, r);
        else if (name && *name) {
            mbtool_sieve_conf(&limits, &allowed);
            r = sievedir_ensure_bc(buf_cstring(&dir), name, &limits,
                                   allowed.count ? &allowed : NULL, 1,
                                   NULL, NULL);
            if (r != SIEVEDIR_OK)
                ret = mbtool_sieve_fail("activate (compiled form)", name,
                                        r);
        }
    } else if (strcmp(sub, "delete") == 0) {
        r = sievedir_delete(buf_cstring(&dir), name);
        if (r != SIEVEDIR_OK)
            ret = mbtool_sieve_fail("delete", name, r);
    } else {
        ret = mbtool_usage_error(usage);
    }
out:
    buf_free(&user);
    buf_free(&dir);
    buf_free(&text);
    strarray_fini(&allowed);
    return ret;
}

int main(int argc, char **argv)
{
    static const struct option mbtool_longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = NULL, *cmd;
    struct imapconf *conf = NULL;
    char *err = NULL;
    struct stat st;
    int opt, ret;

    if (argv[0])
        mbtool_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    log_init(mbtool_progname, LOG_TO_STDERR);
    log_set_info(0);
    /* options before the command only */
    while ((opt = getopt_long(argc, argv, "+C:h", mbtool_longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'h': mbtool_usage(stdout); return MBTOOL_EXIT_OK;
        default: return mbtool_usage_error("unknown option");
        }
    }
    if (optind >= argc)
        return mbtool_usage_error("no command");
    cmd = argv[optind];
    if (strcmp(cmd, "help") == 0) {
        mbtool_usage(stdout);
        return MBTOOL_EXIT_OK;
    }
    if (!config)
        config = MBTOOL_DEFAULT_CONFIG;
    if (stat(config, &st) < 0) {
        fprintf(stderr, "%s: %s: %s\n", mbtool_progname, config, strerror(errno));
        return MBTOOL_EXIT_FAIL;
    }
    if (imapconf_load(config, &conf, &err) != 0) {
        fprintf(stderr, "%s: %s\n", mbtool_progname, err ? err : "out of memory");
        free(err);
        return MBTOOL_EXIT_FAIL;
    }
    /* started as root: become cyrus_user before anything is written, or
     * the server could not use what this creates */
    {
        const char *perr = NULL;
        if (privs_drop_to_cyrus_user(conf, &perr) != PRIVS_OK) {
            fprintf(stderr, "%s: %s\n", mbtool_progname, perr);
            imapconf_free(&conf);
            return MBTOOL_EXIT_FAIL;
        }
    }
    {
        const char *cd = imapconf_getstring(conf, "configdirectory");
        if (cd && *cd && access(cd, W_OK | X_OK) < 0 && errno == EACCES)
            fprintf(stderr, "%s: warning: configdirectory %s is not writable "
                    "by uid %ld, the server's user: give it to that user "
                    "(chown)\n", mbtool_progname, cd, (long)getuid());
    }
    mbtool_conf = conf;
    {
        const char *why = NULL;

        if (userid_policy_init(conf, &mbtool_policy, &why) != STORE_OK) {
            fprintf(stderr, "%s: bad defaultdomain \"%s\": %s\n",
                    mbtool_progname, imapconf_getstring(conf, "defaultdomain"),
                    why ? why : "out of memory");
            imapconf_free(&conf);
            return MBTOOL_EXIT_FAIL;
        }
    }
    argc -= optind;
    argv += optind;

    if (strcmp(cmd, "create") == 0)
        ret = mbtool_create(argc, argv);
    else if (strcmp(cmd, "delete") == 0)
        ret = mbtool_delete(argc, argv);
    else if (strcmp(cmd, "rename") == 0)
        ret = mbtool_rename(argc, argv);
    else if (strcmp(cmd, "undelete") == 0)
        ret = mbtool_undelete(argc, argv);
    else if (strcmp(cmd, "list") == 0)
        ret = mbtool_list(argc, argv);
    else if (strcmp(cmd, "info") == 0)
        ret = mbtool_info(argc, argv);
    else if (strcmp(cmd, "setacl") == 0)
        ret = mbtool_setacl(argc, argv);
    else if (strcmp(cmd, "quota") == 0)
        ret = mbtool_quota(argc, argv);
    else if (strcmp(cmd, "check") == 0)
        ret = mbtool_tree_op(argc, argv, "check [-r] NAME | -a",
                             mbtool_check_one);
    else if (strcmp(cmd, "reconstruct") == 0)
        ret = mbtool_tree_op(argc, argv, "reconstruct [-r] NAME | -a",
                             mbtool_reconstruct_one);
    else if (strcmp(cmd, "cleanup") == 0)
        ret = mbtool_tree_op(argc, argv, "cleanup [-r] NAME | -a",
                             mbtool_cleanup_one);
    else if (strcmp(cmd, "prune") == 0)
        ret = mbtool_prune(argc, argv);
    else if (strcmp(cmd, "stage-cleanup") == 0)
        ret = mbtool_stage_cleanup(argc, argv);
    else if (strcmp(cmd, "journal-replay") == 0)
        ret = mbtool_journal_replay(argc, argv);
    else if (strcmp(cmd, "deliver") == 0)
        ret = mbtool_deliver(argc, argv);
    else if (strcmp(cmd, "domains") == 0)
        ret = mbtool_domains(argc, argv);
    else if (strcmp(cmd, "delete-domain") == 0)
        ret = mbtool_delete_domain(argc, argv);
    else if (strcmp(cmd, "sieve") == 0)
        ret = mbtool_sieve(argc, argv);
    else if (strcmp(cmd, "user-dump") == 0)
        ret = mbtool_user_dump(conf, argc, argv);
    else if (strcmp(cmd, "user-load") == 0)
        ret = mbtool_user_load(conf, argc, argv);
    else if (strcmp(cmd, "user-mark") == 0)
        ret = mbtool_user_mark(conf, argc, argv);
    else if (strcmp(cmd, "user-purge") == 0)
        ret = mbtool_user_purge(conf, argc, argv);
    else if (strcmp(cmd, "user-stamp") == 0)
        ret = mbtool_user_stamp(conf, argc, argv);
    else {
        fprintf(stderr, "%s: unknown command \"%s\"\n", mbtool_progname, cmd);
        ret = MBTOOL_EXIT_USAGE;
    }
    userid_policy_free(&mbtool_policy);
    strarray_fini(&mbtool_converted);
    imapconf_free(&conf);
    return ret;
}

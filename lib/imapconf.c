/*
 * imapconf.c - the imapd.conf reader.
 *
 * One static table (imapconf_options[]) drives everything: the names of the
 * known keys, their types, defaults, integer ranges, enum words and the
 * one-line descriptions printed by imapconf_print_table().  A loaded
 * configuration is an array parallel to that table plus a list of "extra"
 * keys whose names are open-ended (partition-NAME, sasl_*).
 *
 * Invariants of a struct imapconf: every table slot holds a parsed value
 * (the file's or the default's; defaults go through the same parser as file
 * values, so a bad default is caught by imapconf_defaults()); string-valued
 * slots (STRING, DBNAME, ENUM) hold an owned, non-NULL copy.  Keys are
 * stored lower-cased, as Cyrus does, so lookups ignore case.
 *
 * Parsing works on (pointer, length) cursors over the whole text; no line
 * length limit, and a NUL byte inside a line is an error rather than a
 * silent truncation.  Library code: errors are returned, never fatal.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"

/*
 * Database backends by default: the one place to revise them.  Chosen by
 * measurement (tools/appendbench, doc/bench/store.md: messages/s of 13,870
 * bytes, 1 and 8 processes, 1 and 10 recipients, median of 3 runs):
 *  - mboxlist_db skiplist: a delivery only reads the list, and every
 *    backend delivered within the noise of the others (8 processes, 10
 *    recipients: skiplist 875/s, db3-nosync 915, db3 830, lmdb 723, flat
 *    699); skiplist is Cyrus's format (Cyrus's own tools read it) and
 *    needs no shared environment.
 *  - duplicate_db skiplist: written once per message (all recipients in
 *    one transaction); fastest in 3 of the 4 cells (8 x 10: skiplist
 *    875/s, db3-nosync 699, db3 622, lmdb 615, flat 271); db3-nosync won
 *    only 8 x 1 (1947 vs 1697) and brings Berkeley DB's shared environment,
 *    where a process killed inside the library can stall the others.
 *  - quota_db lmdb: written per recipient mailbox that has a quota root;
 *    of the durable backends fastest with 8 processes and 1 recipient
 *    (1246/s vs db3 1137, skiplist 1116) and close to db3 with 10 (287 vs
 *    305, skiplist 237); its readers (the over-quota check) never wait.
 *    db3-nosync is faster with many recipients (517) and sound here
 *    (usage is re-derived from the indexes), with the caveat above.
 *  - seenstate_db skiplist, subscription_db flat: not on the delivery path;
 *    one small file per user, so no backend that needs an environment or a
 *    lock file beside each file; Cyrus's defaults.  Durable single-record
 *    commits: skiplist 2,730/s (doc/bench/cyrusdb.md), far above what IMAP
 *    flag changes ask.
 */
#define IMAPCONF_DEFAULT_MBOXLIST_DB      "skiplist"
#define IMAPCONF_DEFAULT_DUPLICATE_DB     "skiplist"
#define IMAPCONF_DEFAULT_SEENSTATE_DB     "skiplist"
#define IMAPCONF_DEFAULT_SUBSCRIPTION_DB  "flat"
#define IMAPCONF_DEFAULT_QUOTA_DB         "lmdb"

/* Largest configuration file read (a sanity bound, not a line limit). */
#define IMAPCONF_MAX_FILE ((size_t)64 << 20)

/* Longest excerpt of an offending value quoted in an error message. */
#define IMAPCONF_QUOTE_MAX 80

#define IMAPCONF_PARTITION_PREFIX "partition-"
#define IMAPCONF_SASL_PREFIX "sasl_"

struct imapconf_option {
    const char *name;
    enum imapconf_type type;
    const char *def;               /* default, as it would be written */
    long min, max;                 /* IMAPCONF_INT only */
    const char *const *words;      /* IMAPCONF_ENUM only, NULL-terminated */
    int remote_ok;                 /* IMAPCONF_DBNAME: a backend without a
                                    * file (etcd) is allowed */
    const char *desc;
};

static const char *const imapconf_virtdomains_words[] = {
    "off", "userid", "on", NULL
};

static const char *const imapconf_spool_sync_words[] = {
    "group", "file", "off", "journal", NULL
};

static const char *const imapconf_bare_newlines_words[] = {
    "reject", "fix", NULL
};

static const char *const imapconf_expunge_mode_words[] = {
    "immediate", "delayed", NULL
};

static const char *const imapconf_smtp_backend_words[] = {
    "sendmail", "host", NULL
};

static const char *const imapconf_delete_mode_words[] = {
    "immediate", "delayed", NULL
};

static const struct imapconf_option imapconf_options[] = {
    { .name = "configdirectory", .type = IMAPCONF_STRING,
      .def = IMAPCONF_DEFAULT_CONFIGDIR,
      .desc = "directory of the databases and other state files" },
    { .name = "defaultpartition", .type = IMAPCONF_STRING,
      .def = "default",
      .desc = "partition for new mailboxes when none is named" },
    { .name = "mboxlist_db", .type = IMAPCONF_DBNAME,
      .def = IMAPCONF_DEFAULT_MBOXLIST_DB,
      .desc = "cyrusdb backend of the mailbox list" },
    { .name = "duplicate_db", .type = IMAPCONF_DBNAME,
      .def = IMAPCONF_DEFAULT_DUPLICATE_DB,
      .desc = "cyrusdb backend of the duplicate delivery database" },
    { .name = "seenstate_db", .type = IMAPCONF_DBNAME,
      .def = IMAPCONF_DEFAULT_SEENSTATE_DB,
      .desc = "cyrusdb backend of the per-user seen state" },
    { .name = "subscription_db", .type = IMAPCONF_DBNAME,
      .def = IMAPCONF_DEFAULT_SUBSCRIPTION_DB,
      .desc = "cyrusdb backend of the per-user subscription lists" },
    { .name = "quota_db", .type = IMAPCONF_DBNAME,
      .def = IMAPCONF_DEFAULT_QUOTA_DB,
      .desc = "cyrusdb backend of the quota database" },
    { .name = "etcd_endpoints", .type = IMAPCONF_STRING,
      .def = "http://127.0.0.1:2379",
      .desc = "cyrusdb etcd backend: comma-separated http(s)://host:port "
              "of the cluster's members; the next is tried when one "
              "cannot be reached" },
    { .name = "etcd_prefix", .type = IMAPCONF_STRING, .def = "/cyrusdeliver/",
      .desc = "cyrusdb etcd backend: key prefix; a database FILE lives "
              "under PREFIX + FILE + \"/\"" },
    { .name = "etcd_timeout", .type = IMAPCONF_INT, .def = "5000",
      .min = 1, .max = 3600000,
      .desc = "cyrusdb etcd backend: time limit of one request to the "
              "cluster, in milliseconds; past it the call fails with an "
              "I/O error" },
    { .name = "etcd_cacert", .type = IMAPCONF_STRING, .def = "",
      .desc = "cyrusdb etcd backend: CA certificate file (PEM) for https "
              "endpoints; empty = the system's" },
    { .name = "etcd_cert", .type = IMAPCONF_STRING, .def = "",
      .desc = "cyrusdb etcd backend: client certificate file (PEM); "
              "empty = none" },
    { .name = "etcd_key", .type = IMAPCONF_STRING, .def = "",
      .desc = "cyrusdb etcd backend: private key file (PEM) of etcd_cert" },
    { .name = "hashimapspool", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "spread mailbox directories over hashed subdirectories "
              "of each partition" },
    { .name = "unixhierarchysep", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "use / instead of . as the hierarchy separator in "
              "mailbox names" },
    { .name = "duplicatesuppression", .type = IMAPCONF_SWITCH, .def = "yes",
      .desc = "deliver a message-id at most once to each mailbox" },
    { .name = "maxmessagesize", .type = IMAPCONF_INT, .def = "0",
      .min = 0, .max = LONG_MAX,
      .desc = "largest message accepted by LMTP, in bytes; 0 = unlimited" },
    { .name = "quotawarn", .type = IMAPCONF_INT, .def = "90",
      .min = 0, .max = 100,
      .desc = "percentage of the quota at which users are warned" },
    { .name = "lmtp_downcase_rcpt", .type = IMAPCONF_SWITCH, .def = "yes",
      .desc = "lower-case the local part of LMTP recipients" },
    { .name = "lmtp_over_quota_perm_failure", .type = IMAPCONF_SWITCH,
      .def = "no",
      .desc = "refuse over-quota deliveries permanently (5xx) instead of "
              "temporarily (4xx)" },
    { .name = "virtdomains", .type = IMAPCONF_ENUM, .def = "off",
      .words = imapconf_virtdomains_words,
      .desc = "virtual domains: off; userid = domain from user@domain; "
              "on = also from the server address" },
    { .name = "defaultdomain", .type = IMAPCONF_STRING, .def = "",
      .desc = "with virtdomains: the domain whose users live in the "
              "domain-less namespace (user@DEFAULTDOMAIN is user); "
              "empty = none" },
    { .name = "admins", .type = IMAPCONF_STRING, .def = "",
      .desc = "space-separated user ids of the administrators" },
    { .name = "proxyservers", .type = IMAPCONF_STRING, .def = "",
      .desc = "users (a frontend's proxy_authname) that may authenticate "
              "with their own password and log in as another user (SASL "
              "authorization id): the frontends of an imap_proxy tier" },
    { .name = "servername", .type = IMAPCONF_STRING, .def = "",
      .desc = "this server's name in replies and headers; empty = the "
              "host name" },
    { .name = "allowplaintext", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "allow plaintext passwords on unencrypted connections" },
    { .name = "tls_server_cert", .type = IMAPCONF_STRING, .def = "",
      .desc = "file with the server's TLS certificate (PEM)" },
    { .name = "tls_server_key", .type = IMAPCONF_STRING, .def = "",
      .desc = "file with the server's TLS private key (PEM)" },
    { .name = "cyrus_user", .type = IMAPCONF_STRING, .def = "cyrus",
      .desc = "the unprivileged user the master switches to when started "
              "as root" },
    { .name = "stage_dirs", .type = IMAPCONF_INT, .def = "16",
      .min = 1, .max = 1024,
      .desc = "staging directories per partition (PARTITION/stage./NN); "
              "concurrent deliveries are spread over them by process id" },
    /* default journal, by measurement on this machine kind (ext4 on a
     * virtual disk, 2 cores): bench/run.sh -x nosync, 2,000 messages of
     * 13,870 bytes, variants interleaved, medians of msgs/s, journal vs
     * the best other durable mode: 1,459 vs 913 file (20 connections),
     * 717 vs 697 file (40), 1,495 vs 835 file (100); again at 40 with 5
     * rounds: see doc/bench/durable.md.  It needs ctl_cyrusdb -r in
     * START (the stock cyrus.conf has it) to replay after a power loss.
     * Before it, group (doc/bench/lmtp.md: 5-19% over file). */
    { .name = "spool_sync", .type = IMAPCONF_ENUM, .def = "journal",
      .words = imapconf_spool_sync_words,
      .desc = "how a delivery is made durable before it is acknowledged: "
              "group = deliveries waiting at the same moment share one "
              "sync round of the file system (leader/follower across "
              "processes); file = each delivery syncs its own files and "
              "directories; off = no sync at all, UNSAFE: a crash or power "
              "loss can lose acknowledged mail (for measurement, or for "
              "admins who accept that, like a spool on tmpfs); journal = "
              "each delivery appends one redo record to its partition's "
              "journal (PARTITION/journal./journal), made durable by one "
              "fdatasync shared by every delivery waiting at that moment; "
              "message files and indexes are synced in bulk at checkpoints "
              "and restored from the journal by ctl_cyrusdb -r after a "
              "power loss" },
    /* Flag changes unsynced by default, as Dovecot's mail_fsync =
     * optimized: a STORE took two fdatasyncs of the index (the dirty bit,
     * the commit round), the slowest IMAP command after EXPUNGE. */
    { .name = "spool_sync_flags", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "yes = a change of flags or keywords (IMAP STORE, \\Seen "
              "by FETCH) is synced to disk before the command completes; "
              "no = it reaches the page cache at once (every session sees "
              "it) and the disk with the mailbox's next expunge (or "
              "append, with spool_sync file or group), a second after the "
              "session's last command, when it closes the mailbox, or by "
              "the kernel's writeback: a power loss may undo the flag "
              "changes of the last moments, never a message" },
    { .name = "journal_size", .type = IMAPCONF_INT, .def = "16777216",
      .min = 1048576, .max = 1073741824,
      .desc = "bytes of one of the two segments of a partition's delivery "
              "journal (spool_sync: journal); the file grows to 4 KiB + 2 x "
              "this (zeros written 1 MiB ahead of the records, once); a "
              "segment is reused after a "
              "checkpoint (one syncfs of the partition), so larger = fewer "
              "checkpoints; a message bigger than a segment is synced the "
              "group way" },
    { .name = "lmtp_bare_newlines", .type = IMAPCONF_ENUM, .def = "reject",
      .words = imapconf_bare_newlines_words,
      .desc = "a message with a bare CR or LF: reject = refuse it with "
              "554 5.6.0; fix = turn each into CRLF" },
    { .name = "expunge_mode", .type = IMAPCONF_ENUM, .def = "immediate",
      .words = imapconf_expunge_mode_words,
      .desc = "expunged messages: immediate = the next cleanup (mbtool "
              "cleanup, cyr_expire -X) removes them whatever their age; "
              "delayed = cyr_expire -X DAYS removes only those expunged "
              "more than DAYS ago" },
    { .name = "delete_mode", .type = IMAPCONF_ENUM, .def = "immediate",
      .words = imapconf_delete_mode_words,
      .desc = "deleted mailboxes: immediate = removed at once; delayed = "
              "renamed into the hidden DELETED. hierarchy with a hex "
              "timestamp, removed by cyr_expire -D DAYS, restored by "
              "mbtool undelete" },
    { .name = "maxheaderlines", .type = IMAPCONF_INT, .def = "1000",
      .min = 10, .max = 1000000,
      .desc = "most header lines (continuations included) an LMTP "
              "message may have; more: 554 5.6.0" },
    { .name = "lmtp_max_recipients", .type = IMAPCONF_INT, .def = "1000",
      .min = 100, .max = 1000000,
      .desc = "most RCPT TO per LMTP transaction; more get 452 4.5.3 "
              "(RFC 5321 asks for at least 100)" },
    { .name = "lmtp_timeout", .type = IMAPCONF_INT, .def = "300",
      .min = 10, .max = 86400,
      .desc = "seconds an LMTP client may stay silent before the "
              "connection is closed with 421" },
    { .name = "lmtp_proxy", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "lmtpd is a frontend: each recipient is looked up in the "
              "directory (directory_db) and its message relayed over LMTP "
              "to its backend (proxy_backends); nothing is stored here" },
    { .name = "imap_proxy", .type = IMAPCONF_SWITCH, .def = "no",
      .desc = "imapd is a frontend: a user who logs in is looked up in the "
              "directory (directory_db) and the session relayed to its "
              "backend (proxy_imap_backends), opened there with the "
              "frontend's proxy_authname and the user as authorization id; "
              "no mailbox is kept here" },
    { .name = "proxy_imap_backends", .type = IMAPCONF_STRING, .def = "",
      .desc = "the backends of imap_proxy: space-separated NAME=HOST:PORT "
              "of each backend's IMAP service (HOST is also the name its "
              "certificate must carry)" },
    { .name = "proxy_authname", .type = IMAPCONF_STRING, .def = "proxy",
      .desc = "the user a frontend authenticates as at its backends (one "
              "of their proxyservers)" },
    { .name = "proxy_password", .type = IMAPCONF_STRING, .def = "",
      .desc = "the password of proxy_authname at the backends" },
    { .name = "proxy_starttls", .type = IMAPCONF_SWITCH, .def = "yes",
      .desc = "a frontend starts TLS on its IMAP connection to a backend "
              "before logging in, and verifies the backend's certificate "
              "(tls_client_ca_file) and name" },
    { .name = "tls_client_ca_file", .type = IMAPCONF_STRING, .def = "",
      .desc = "CA certificates (PEM) a frontend trusts for its backends' "
              "certificates; empty = the system's trust store" },
    { .name = "directory_db", .type = IMAPCONF_DBNAME, .def = "flat",
      .remote_ok = 1,
      .desc = "cyrusdb backend of the user -> backend directory of "
              "lmtp_proxy (etcd: one map for every frontend)" },
    { .name = "directory_db_path", .type = IMAPCONF_STRING, .def = "",
      .desc = "file of the directory (etcd: its name under etcd_prefix); "
              "empty = CONFIGDIR/directory.db" },
    { .name = "directory_cache_ttl", .type = IMAPCONF_INT, .def = "5",
      .min = 0, .max = 3600,
      .desc = "seconds a frontend reuses a directory answer before it "
              "reads the record again; 0 = read it for every recipient" },
    { .name = "directory_cache_watched_ttl", .type = IMAPCONF_INT,
      .def = "600", .min = 0, .max = 86400,
      .desc = "seconds a frontend reuses an answer naming a backend while "
              "its etcd watch is up (a change drops it at once); never "
              "less than directory_cache_ttl" },
    { .name = "xfer_command", .type = IMAPCONF_STRING, .def = "",
      .desc = "cyr_user move: the shell command that runs mbtool on a "
              "backend, %b standing for the backend's name (\"ssh "
              "%b.example.com mbtool -C /etc/imapd.conf\")" },
    { .name = "proxy_backends", .type = IMAPCONF_STRING, .def = "",
      .desc = "the backends of lmtp_proxy: space-separated NAME=ADDRESS, "
              "ADDRESS host:port, [v6addr]:port or /path of a UNIX socket "
              "of the backend's LMTP service (trusted or -a)" },
    { .name = "proxy_timeout", .type = IMAPCONF_INT, .def = "60",
      .min = 1, .max = 3600,
      .desc = "seconds a frontend waits for a backend to connect or to "
              "answer one command (LMTP: then 451 4.4.2 for its "
              "recipients; IMAP: the login fails with NO [UNAVAILABLE])" },
    { .name = "lmtp_max_idle", .type = IMAPCONF_INT, .def = "32",
      .min = 1, .max = 1000,
      .desc = "most connections one lmtpd process holds: it serves "
              "whichever has a command and waits for the others in one "
              "poll, so idle clients do not hold processes; 1 = one "
              "connection per process" },
    { .name = "lmtp_idle_timeout", .type = IMAPCONF_INT, .def = "10",
      .min = 1, .max = 86400,
      .desc = "seconds an LMTP connection with no transaction open may "
              "stay silent once its process holds lmtp_max_idle "
              "connections and a new client waits: then it is closed "
              "with 421 to make room" },
    { .name = "prelogin_timeout", .type = IMAPCONF_INT, .def = "60",
      .min = 5, .max = 3600,
      .desc = "seconds an IMAP client may stay idle before it has logged "
              "in (then `timeout` applies)" },
    { .name = "sievedir", .type = IMAPCONF_STRING, .def = "",
      .desc = "directory of the users' Sieve scripts (timsieved, "
              "delivery); empty = CONFIGDIR/sieve" },
    { .name = "sieve_maxscriptsize", .type = IMAPCONF_INT, .def = "32",
      .min = 1, .max = 1024,
      .desc = "largest Sieve script a user may upload, in KiB" },
    { .name = "sieve_maxscripts", .type = IMAPCONF_INT, .def = "5",
      .min = 1, .max = 10000,
      .desc = "most Sieve scripts a user may keep" },
    { .name = "sieve_extensions", .type = IMAPCONF_STRING, .def = "",
      .desc = "space-separated Sieve extensions scripts may require; "
              "empty = every supported one" },
    { .name = "sieve_globaldir", .type = IMAPCONF_STRING, .def = "",
      .desc = "directory of the global Sieve scripts (include :global "
              "\"NAME\" reads NAME.script there); empty = SIEVEDIR/global" },
    { .name = "timeout", .type = IMAPCONF_INT, .def = "32",
      .min = 30, .max = 1440,
      .desc = "minutes an IMAP client may stay idle before the autologout "
              "(RFC 3501 asks for at least 30)" },
    { .name = "syslog_prefix", .type = IMAPCONF_STRING, .def = "",
      .desc = "string put before the program name in syslog lines" },
    { .name = "log_file", .type = IMAPCONF_STRING, .def = "",
      .desc = "file the master, lmtpd and imapd append their log lines to "
              "instead of syslog (master -l still means stderr); empty = "
              "syslog, or stderr when nothing listens on /dev/log" },
    { .name = "autocreate_quota", .type = IMAPCONF_INT, .def = "-1",
      .min = -1, .max = 2147483647L,
      .desc = "create a user's missing INBOX at login: -1 = never; 0 = "
              "create it; N > 0 = create it as a quota root of N KiB" },
    { .name = "autocreate_post", .type = IMAPCONF_SWITCH, .def = "yes",
      .desc = "with autocreate_quota >= 0, lmtpd also creates a missing "
              "INBOX for a delivery to it" },
    { .name = "autocreate_users", .type = IMAPCONF_STRING,
      .def = "anyone",
      .desc = "whose INBOX autocreate_quota creates: anyone, or user ids "
              "separated by spaces or commas" },
    { .name = "autocreate_inbox_folders", .type = IMAPCONF_STRING,
      .def = "",
      .desc = "folders created below an autocreated INBOX and subscribed, "
              "separated by | (e.g. Sent|Drafts|Trash|Junk|Archive)" },
    { .name = "xlist-sent", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreate_inbox_folders folder made with the special "
              "use \\Sent (RFC 6154), e.g. Sent" },
    { .name = "xlist-drafts", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\Drafts" },
    { .name = "xlist-trash", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\Trash" },
    { .name = "xlist-junk", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\Junk" },
    { .name = "xlist-archive", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\Archive" },
    { .name = "xlist-all", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\All" },
    { .name = "xlist-flagged", .type = IMAPCONF_STRING, .def = "",
      .desc = "the autocreated folder made \\Flagged" },
    { .name = "sendmail", .type = IMAPCONF_STRING,
      .def = "/usr/sbin/sendmail",
      .desc = "program that sends Sieve's redirects, vacation replies "
              "and rejections: a path, optionally followed by arguments "
              "separated by spaces (run as PATH ARGS -i -f SENDER -- RCPT)" },
    { .name = "smtp_backend", .type = IMAPCONF_ENUM, .def = "sendmail",
      .words = imapconf_smtp_backend_words,
      .desc = "how lmtpd hands Sieve's redirects and vacation replies to "
              "the MTA: sendmail = a `sendmail` process per message; "
              "host = SMTP to smtp_host over a connection each lmtpd "
              "process keeps open" },
    { .name = "smtp_host", .type = IMAPCONF_STRING,
      .def = "localhost:587",
      .desc = "the MTA of smtp_backend: host: HOST[:PORT] (port 587 when "
              "not given; [ADDRESS]:PORT for IPv6) or a UNIX socket's "
              "path; a trailing /noauth is accepted, /tls is refused" },
    { .name = "metrics_listen", .type = IMAPCONF_STRING, .def = "",
      .desc = "HOST:PORT ([ADDRESS]:PORT for IPv6) where metricsd serves "
              "Prometheus metrics on /metrics; the master runs metricsd "
              "and workers count into CONFIGDIR/metrics.shm only when it "
              "is set; empty = off" },
};

#define IMAPCONF_NOPTIONS (sizeof(imapconf_options) / sizeof(imapconf_options[0]))

struct imapconf_value {
    char *str;          /* STRING, DBNAME, ENUM: owned, never NULL */
    long num;           /* INT, SWITCH (0/1), ENUM (index into words) */
    unsigned long line; /* the line that set it; 0 = the default */
};

/* A key outside the table: partition-NAME or sasl_*. */
struct imapconf_extra {
    char *key;          /* lower-cased, with its prefix */
    char *value;
    unsigned long line;
};

struct imapconf {
    struct imapconf_value values[IMAPCONF_NOPTIONS];
    struct imapconf_extra *extras;
    size_t nextras;
    size_t extras_alloc;
};

/* ---- small helpers ----------------------------------------------------- */

static int imapconf_isspace(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static int imapconf_iskeychar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static char imapconf_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* ASCII case-insensitive equality, independent of the locale. */
static int imapconf_caseeq(const char *a, const char *b)
{
    while (*a && imapconf_lower(*a) == imapconf_lower(*b)) {
        a++;
        b++;
    }
    return imapconf_lower(*a) == imapconf_lower(*b);
}

static int imapconf_hasprefix(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

/* Append a printable excerpt of s to b, in single quotes. */
static void imapconf_quote(struct buf *b, const char *s)
{
    char out[IMAPCONF_QUOTE_MAX + 1];
    size_t len = strlen(s);

    log_sanitize(s, len, out, sizeof(out));
    buf_printf(b, "'%s%s'", out, len > IMAPCONF_QUOTE_MAX ? "..." : "");
}

/* The table's index by name: open addressing over a power of two at
 * least twice the options, each slot 1 + an option's index (0 empty).
 * Every getter looks its key up here (a delivery asks some 300 times):
 * the scan it replaces compared against half the table each time. */
#define IMAPCONF_HASH_SIZE 512
static uint16_t imapconf_hash_slots[IMAPCONF_HASH_SIZE];
static pthread_once_t imapconf_hash_once = PTHREAD_ONCE_INIT;

static size_t imapconf_hash(const char *key)
{
    uint32_t h = 2166136261u;   /* FNV-1a */

    for (; *key; key++)
        h = (h ^ (unsigned char)*key) * 16777619u;
    return h & (IMAPCONF_HASH_SIZE - 1);
}

static void imapconf_hash_build(void)
{
    size_t i, k;

    for (i = 0; i < IMAPCONF_NOPTIONS; i++) {
        for (k = imapconf_hash(imapconf_options[i].name);
             imapconf_hash_slots[k]; k = (k + 1) & (IMAPCONF_HASH_SIZE - 1))
            ;
        imapconf_hash_slots[k] = (uint16_t)(i + 1);
    }
}

static const struct imapconf_option *imapconf_option_find(const char *key,
                                                          size_t *index_r)
{
    size_t k;

    _Static_assert(IMAPCONF_NOPTIONS * 2 <= IMAPCONF_HASH_SIZE,
                   "imapconf: the name index is too small for the table");
    pthread_once(&imapconf_hash_once, imapconf_hash_build);
    for (k = imapconf_hash(key); imapconf_hash_slots[k];
         k = (k + 1) & (IMAPCONF_HASH_SIZE - 1)) {
        size_t i = imapconf_hash_slots[k] - 1u;

        if (!strcmp(imapconf_options[i].name, key)) {
            if (index_r)
                *index_r = i;
            return &imapconf_options[i];
        }
    }
    return NULL;
}

/* ---- value parsing ----------------------------------------------------- */

static int imapconf_parse_switch(const char *val, long *num_r)
{
    static const char *const yes[] = { "yes", "on", "true", "1", NULL };
    static const char *const no[] = { "no", "off", "false", "0", NULL };
    size_t i;

    for (i = 0; yes[i]; i++) {
        if (imapconf_caseeq(val, yes[i])) {
            *num_r = 1;
            return 0;
        }
        if (imapconf_caseeq(val, no[i])) {
            *num_r = 0;
            return 0;
        }
    }
    return -1;
}

/*
 * Parse `val` for `opt` into *out (whose str the caller frees).  On a
 * malformed value returns -1 and appends what is wrong to `why`.
 */
static int imapconf_parse_value(const struct imapconf_option *opt,
                                const char *val, struct imapconf_value *out,
                                struct buf *why)
{
    const char *canon = val;
    char *end;
    size_t i;

    out->str = NULL;
    out->num = 0;

    switch (opt->type) {
    case IMAPCONF_STRING:
        break;

    case IMAPCONF_INT:
        if (!*val || !((*val >= '0' && *val <= '9') || *val == '-' ||
                       *val == '+')) {
            imapconf_quote(why, val);
            buf_appendcstr(why, " is not a decimal number");
            return -1;
        }
        errno = 0;
        out->num = strtol(val, &end, 10);
        if (end == val || *end) {
            imapconf_quote(why, val);
            buf_appendcstr(why, " is not a decimal number");
            return -1;
        }
        if (errno == ERANGE || out->num < opt->min || out->num > opt->max) {
            imapconf_quote(why, val);
            buf_printf(why, " is out of range %ld..%ld", opt->min, opt->max);
            return -1;
        }
        return 0;

    case IMAPCONF_SWITCH:
        if (imapconf_parse_switch(val, &out->num) < 0) {
            imapconf_quote(why, val);
            buf_appendcstr(why, " is not a boolean "
                           "(yes/no, on/off, true/false, 1/0)");
            return -1;
        }
        return 0;

    case IMAPCONF_DBNAME: {
        const struct cyrusdb_registry_entry *e = cyrusdb_lookup(val);
        if (!e) {
            buf_appendcstr(why, "unknown database backend ");
            imapconf_quote(why, val);
            buf_printf(why, " (known: %s)", cyrusdb_names());
            return -1;
        }
        if (e->nofile && !opt->remote_ok) {
            /* the servers' databases are files beside each other (copies,
             * renames, per-user files): not for a remote backend yet */
            buf_appendcstr(why, "database backend ");
            imapconf_quote(why, val);
            buf_appendcstr(why, " is for cyr_dbtool and cvt_cyrusdb only; "
                           "the servers cannot keep their databases in it yet");
            return -1;
        }
        canon = e->name;
        break;
    }

    case IMAPCONF_ENUM:
        for (i = 0; opt->words[i]; i++)
            if (imapconf_caseeq(val, opt->words[i]))
                break;
        if (!opt->words[i]) {
            imapconf_quote(why, val);
            buf_appendcstr(why, " is not one of:");
            for (i = 0; opt->words[i]; i++)
                buf_printf(why, " %s", opt->words[i]);
            return -1;
        }
        out->num = (long)i;
        canon = opt->words[i];
        break;
    }

    out->str = strdup(canon);
    if (!out->str) {
        buf_appendcstr(why, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- the configuration object ------------------------------------------ */

struct imapconf *imapconf_defaults(void)
{
    struct imapconf *conf = calloc(1, sizeof(*conf));
    struct buf why = BUF_INITIALIZER;
    size_t i;

    if (!conf)
        return NULL;
    for (i = 0; i < IMAPCONF_NOPTIONS; i++) {
        const struct imapconf_option *opt = &imapconf_options[i];
        if (imapconf_parse_value(opt, opt->def, &conf->values[i], &why) < 0) {
            log_error("imapconf: bad default key=<%s> error=<%s>",
                      opt->name, buf_cstring(&why));
            buf_free(&why);
            imapconf_free(&conf);
            return NULL;
        }
    }
    buf_free(&why);
    return conf;
}

void imapconf_free(struct imapconf **confp)
{
    struct imapconf *conf = confp ? *confp : NULL;
    size_t i;

    if (!conf)
        return;
    for (i = 0; i < IMAPCONF_NOPTIONS; i++)
        free(conf->values[i].str);
    for (i = 0; i < conf->nextras; i++) {
        free(conf->extras[i].key);
        free(conf->extras[i].value);
    }
    free(conf->extras);
    free(conf);
    *confp = NULL;
}

static struct imapconf_extra *imapconf_extra_find(const struct imapconf *conf,
                                                  const char *key)
{
    size_t i;

    for (i = 0; i < conf->nextras; i++)
        if (imapconf_caseeq(conf->extras[i].key, key))
            return &conf->extras[i];
    return NULL;
}

/* Add a new extra key (which must not be there yet); takes key and value. */
static int imapconf_extra_add(struct imapconf *conf, char *key, char *value,
                              unsigned long line)
{
    if (conf->nextras == conf->extras_alloc) {
        size_t n = conf->extras_alloc ? conf->extras_alloc * 2 : 8;
        struct imapconf_extra *p;

        if (n > SIZE_MAX / sizeof(*p) ||
            !(p = realloc(conf->extras, n * sizeof(*p)))) {
            free(key);
            free(value);
            return -1;
        }
        conf->extras = p;
        conf->extras_alloc = n;
    }
    conf->extras[conf->nextras].key = key;
    conf->extras[conf->nextras].value = value;
    conf->extras[conf->nextras].line = line;
    conf->nextras++;
    return 0;
}

/* ---- the parser -------------------------------------------------------- */

/* Build "NAME:LINE: " at the start of a message. */
static void imapconf_where(struct buf *b, const char *name, unsigned long line)
{
    buf_printf(b, "%s:%lu: ", name, line);
}

/* Hand the message in b to *error_r (or drop it). */
static void imapconf_set_error(struct buf *b, char **error_r)
{
    if (error_r)
        *error_r = buf_release(b);
    buf_free(b);
}

/*
 * Handle one line (already free of its '\n'); `key` and `val` are scratch
 * buffers.  Returns 0, or -1 with the message in `err`.
 */
static int imapconf_line(struct imapconf *conf, const char *name,
                         unsigned long lineno, const char *p, size_t len,
                         struct buf *key, struct buf *val, struct buf *err,
                         int quiet)
{
    const struct imapconf_option *opt;
    const char *colon;
    size_t keylen, i, index;

    if (memchr(p, '\0', len)) {
        imapconf_where(err, name, lineno);
        buf_appendcstr(err, "NUL byte in line");
        return -1;
    }
    while (len && imapconf_isspace(*p)) {
        p++;
        len--;
    }
    while (len && imapconf_isspace(p[len - 1]))
        len--;
    if (!len || *p == '#')
        return 0;

    colon = memchr(p, ':', len);
    if (!colon) {
        imapconf_where(err, name, lineno);
        buf_appendcstr(err, "malformed line (no colon); expected \"key: value\"");
        return -1;
    }
    keylen = (size_t)(colon - p);
    while (keylen && imapconf_isspace(p[keylen - 1]))
        keylen--;
    if (!keylen) {
        imapconf_where(err, name, lineno);
        buf_appendcstr(err, "malformed line (no key before the colon)");
        return -1;
    }
    buf_reset(key);
    for (i = 0; i < keylen; i++) {
        if (!imapconf_iskeychar(p[i])) {
            char out[IMAPCONF_QUOTE_MAX + 1];
            imapconf_where(err, name, lineno);
            buf_printf(err, "malformed line (invalid key '%s'; keys are "
                       "letters, digits, '-' and '_')",
                       log_sanitize(p, keylen, out, sizeof(out)));
            return -1;
        }
        if (buf_putc(key, imapconf_lower(p[i])) < 0)
            goto nomem;
    }
    len -= (size_t)(colon + 1 - p);
    p = colon + 1;
    while (len && imapconf_isspace(*p)) {
        p++;
        len--;
    }
    if (buf_setmap(val, p, len) < 0)
        goto nomem;

    opt = imapconf_option_find(buf_cstring(key), &index);
    if (opt) {
        struct imapconf_value v;
        struct imapconf_value *slot = &conf->values[index];

        struct buf why = BUF_INITIALIZER;

        if (imapconf_parse_value(opt, buf_cstring(val), &v, &why) < 0) {
            imapconf_where(err, name, lineno);
            buf_printf(err, "key %s: %s", opt->name, buf_cstring(&why));
            buf_free(&why);
            return -1;
        }
        buf_free(&why);
        if (slot->line && !quiet)
            log_warning("%s:%lu: key %s given again (first on line %lu); "
                        "the last one counts", name, lineno, opt->name,
                        slot->line);
        free(slot->str);
        *slot = v;
        slot->line = lineno;
        return 0;
    }

    if ((imapconf_hasprefix(buf_cstring(key), IMAPCONF_PARTITION_PREFIX) &&
         key->len > strlen(IMAPCONF_PARTITION_PREFIX)) ||
        (imapconf_hasprefix(buf_cstring(key), IMAPCONF_SASL_PREFIX) &&
         key->len > strlen(IMAPCONF_SASL_PREFIX))) {
        struct imapconf_extra *x = imapconf_extra_find(conf, buf_cstring(key));
        char *value, *keycopy;

        if (!val->len &&
            imapconf_hasprefix(buf_cstring(key), IMAPCONF_PARTITION_PREFIX)) {
            imapconf_where(err, name, lineno);
            buf_printf(err, "key %s: empty path", buf_cstring(key));
            return -1;
        }
        value = strdup(buf_cstring(val));
        if (!value)
            goto nomem;
        if (x) {
            if (!quiet)
                log_warning("%s:%lu: key %s given again (first on line %lu); "
                            "the last one counts", name, lineno, x->key,
                            x->line);
            free(x->value);
            x->value = value;
            x->line = lineno;
            return 0;
        }
        keycopy = buf_release(key);
        if (!keycopy) {
            free(value);
            goto nomem;
        }
        if (imapconf_extra_add(conf, keycopy, value, lineno) < 0)
            goto nomem;
        return 0;
    }

    if (!quiet)
        log_warning("%s:%lu: unknown key %s", name, lineno,
                    buf_cstring(key));
    return 0;

nomem:
    buf_reset(err);
    imapconf_where(err, name, lineno);
    buf_appendcstr(err, "out of memory");
    return -1;
}

static int imapconf_load_text(const char *name, const char *text,
                              size_t len, int quiet,
                              struct imapconf **conf_r, char **error_r)
{
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    struct buf err = BUF_INITIALIZER;
    struct imapconf *conf;
    unsigned long lineno = 0;
    size_t pos = 0;
    int r = 0;

    *conf_r = NULL;
    if (error_r)
        *error_r = NULL;
    if (!name)
        name = "(config)";
    conf = imapconf_defaults();
    if (!conf) {
        buf_printf(&err, "%s: out of memory", name);
        imapconf_set_error(&err, error_r);
        return -1;
    }
    while (pos < len) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t linelen = nl ? (size_t)(nl - line) : len - pos;

        lineno++;
        pos += linelen + (nl ? 1 : 0);
        if (imapconf_line(conf, name, lineno, line, linelen,
                          &key, &val, &err, quiet) < 0) {
            r = -1;
            break;
        }
    }
    buf_free(&key);
    buf_free(&val);
    if (r < 0) {
        imapconf_free(&conf);
        imapconf_set_error(&err, error_r);
        return -1;
    }
    buf_free(&err);
    *conf_r = conf;
    return 0;
}

int imapconf_load_string(const char *name, const char *text, size_t len,
                         struct imapconf **conf_r, char **error_r)
{
    return imapconf_load_text(name, text, len, 0, conf_r, error_r);
}

/* 1 when $CYRUSDELIVER_CONF_WARNED names the file open on fd (as path,
 * or as another name of the same file). */
static int imapconf_warned(const char *path, int fd)
{
    const char *w = getenv("CYRUSDELIVER_CONF_WARNED");
    struct stat a, b;

    if (!w || !*w)
        return 0;
    if (strcmp(w, path) == 0)
        return 1;
    return fstat(fd, &a) == 0 && stat(w, &b) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int imapconf_load(const char *path, struct imapconf **conf_r, char **error_r)
{
    struct buf text = BUF_INITIALIZER;
    struct buf err = BUF_INITIALIZER;
    int fd, r, quiet;

    *conf_r = NULL;
    if (error_r)
        *error_r = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        buf_printf(&err, "%s: cannot open: %s", path, strerror(errno));
        imapconf_set_error(&err, error_r);
        return -1;
    }
    quiet = imapconf_warned(path, fd);
    buf_set_max(&text, IMAPCONF_MAX_FILE);
    for (;;) {
        ssize_t n;

        if (buf_ensure(&text, 65536) < 0) {
            if (errno == EOVERFLOW)
                buf_printf(&err, "%s: file too large (limit %zu MiB)", path,
                           IMAPCONF_MAX_FILE >> 20);
            else
                buf_printf(&err, "%s: out of memory", path);
            goto fail;
        }
        n = read(fd, text.s + text.len, 65536);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            buf_printf(&err, "%s: cannot read: %s", path, strerror(errno));
            goto fail;
        }
        if (n == 0)
            break;
        text.len += (size_t)n;
    }
    close(fd);
    r = imapconf_load_text(path, text.s ? text.s : "", text.len, quiet,
                           conf_r, error_r);
    buf_free(&text);
    buf_free(&err);
    return r;

fail:
    close(fd);
    buf_free(&text);
    imapconf_set_error(&err, error_r);
    return -1;
}

/* ---- getters ----------------------------------------------------------- */

static const char *imapconf_typename(enum imapconf_type t)
{
    switch (t) {
    case IMAPCONF_STRING: return "string";
    case IMAPCONF_INT:    return "int";
    case IMAPCONF_SWITCH: return "switch";
    case IMAPCONF_DBNAME: return "dbname";
    case IMAPCONF_ENUM:   return "enum";
    }
    return "?";
}

/* The slot of `key` if it exists and has one of the types in `mask`
 * (bits 1 << type); otherwise log the programming error and return NULL. */
static const struct imapconf_value *imapconf_get(const struct imapconf *conf,
                                                 const char *key,
                                                 unsigned mask,
                                                 const char *getter)
{
    const struct imapconf_option *opt;
    size_t index;

    if (!conf || !key) {
        log_error("imapconf: %s called without %s", getter,
                  conf ? "a key" : "a configuration");
        return NULL;
    }
    opt = imapconf_option_find(key, &index);
    if (!opt) {
        log_error("imapconf: %s of a key not in the table key=<%s>",
                  getter, key);
        return NULL;
    }
    if (!(mask & (1u << opt->type))) {
        log_error("imapconf: %s of a key of another type key=<%s> type=<%s>",
                  getter, key, imapconf_typename(opt->type));
        return NULL;
    }
    return &conf->values[index];
}

const char *imapconf_getstring(const struct imapconf *conf, const char *key)
{
    const struct imapconf_value *v =
        imapconf_get(conf, key, (1u << IMAPCONF_STRING) |
                     (1u << IMAPCONF_DBNAME) | (1u << IMAPCONF_ENUM),
                     "imapconf_getstring");
    return v ? v->str : NULL;
}

long imapconf_getint(const struct imapconf *conf, const char *key)
{
    const struct imapconf_value *v =
        imapconf_get(conf, key, 1u << IMAPCONF_INT, "imapconf_getint");
    return v ? v->num : 0;
}

int imapconf_getswitch(const struct imapconf *conf, const char *key)
{
    const struct imapconf_value *v =
        imapconf_get(conf, key, 1u << IMAPCONF_SWITCH, "imapconf_getswitch");
    return v ? (int)v->num : 0;
}

int imapconf_getenum(const struct imapconf *conf, const char *key)
{
    const struct imapconf_value *v =
        imapconf_get(conf, key, 1u << IMAPCONF_ENUM, "imapconf_getenum");
    return v ? (int)v->num : 0;
}

const char *imapconf_partition(const struct imapconf *conf, const char *name)
{
    const struct imapconf_extra *x;
    size_t plen = strlen(IMAPCONF_PARTITION_PREFIX);
    size_t i;

    if (!conf || !name || !*name)
        return NULL;
    for (i = 0; i < conf->nextras; i++) {
        x = &conf->extras[i];
        if (!strncmp(x->key, IMAPCONF_PARTITION_PREFIX, plen) &&
            imapconf_caseeq(x->key + plen, name))
            return x->value;
    }
    return NULL;
}

const char *imapconf_getsasl(const struct imapconf *conf, const char *key)
{
    const struct imapconf_extra *x;

    if (!conf || !key || !imapconf_hasprefix(key, IMAPCONF_SASL_PREFIX))
        return NULL;
    x = imapconf_extra_find(conf, key);
    return x ? x->value : NULL;
}

/* ---- walking the keys ---------------------------------------------------- */

void imapconf_foreach(const struct imapconf *conf, imapconf_foreach_fn *fn,
                      void *rock)
{
    char num[32];
    size_t i;

    if (!conf || !fn)
        return;
    for (i = 0; i < IMAPCONF_NOPTIONS; i++) {
        const struct imapconf_option *opt = &imapconf_options[i];
        const struct imapconf_value *v = &conf->values[i];
        const char *value = v->str;

        if (opt->type == IMAPCONF_INT) {
            snprintf(num, sizeof(num), "%ld", v->num);
            value = num;
        } else if (opt->type == IMAPCONF_SWITCH) {
            value = v->num ? "yes" : "no";
        }
        fn(rock, opt->name, value ? value : "", opt->def, v->line);
    }
    for (i = 0; i < conf->nextras; i++)
        fn(rock, conf->extras[i].key, conf->extras[i].value, NULL,
           conf->extras[i].line);
}

int imapconf_is_known(const char *key)
{
    char lower[128];
    size_t i;

    for (i = 0; key[i] && i + 1 < sizeof(lower); i++)
        lower[i] = imapconf_lower(key[i]);
    lower[i] = '\0';
    if (key[i])
        return 0;
    if (imapconf_option_find(lower, NULL))
        return 1;
    return (imapconf_hasprefix(lower, IMAPCONF_PARTITION_PREFIX) &&
            strlen(lower) > strlen(IMAPCONF_PARTITION_PREFIX)) ||
           (imapconf_hasprefix(lower, IMAPCONF_SASL_PREFIX) &&
            strlen(lower) > strlen(IMAPCONF_SASL_PREFIX));
}

/* ---- documentation ----------------------------------------------------- */

void imapconf_print_table(void)
{
    size_t i, j;

    for (i = 0; i < IMAPCONF_NOPTIONS; i++) {
        const struct imapconf_option *opt = &imapconf_options[i];

        printf("%s: %s  # %s", opt->name, opt->def, opt->desc);
        switch (opt->type) {
        case IMAPCONF_INT:
            printf(" (%ld..%ld)", opt->min, opt->max);
            break;
        case IMAPCONF_SWITCH:
            printf(" (yes/no)");
            break;
        case IMAPCONF_DBNAME:
            printf(" (one of: %s)", cyrusdb_names());
            break;
        case IMAPCONF_ENUM:
            printf(" (one of:");
            for (j = 0; opt->words[j]; j++)
                printf(" %s", opt->words[j]);
            printf(")");
            break;
        case IMAPCONF_STRING:
            break;
        }
        printf("\n");
    }
    printf("%sNAME:   # directory of the mail partition NAME\n",
           IMAPCONF_PARTITION_PREFIX);
    printf("%s*:   # passed to the SASL library unchanged\n",
           IMAPCONF_SASL_PREFIX);
}

void imapconf_servername(const struct imapconf *conf, char *out, size_t len)
{
    const char *name = imapconf_getstring(conf, "servername");

    if (len == 0)
        return;
    if (name && *name)
        snprintf(out, len, "%s", name);
    else if (len < 2 || gethostname(out, len - 1) != 0 || !out[0])
        snprintf(out, len, "localhost");
    out[len - 1] = '\0';
}

void imapconf_log_file(const struct imapconf *conf)
{
    const char *path = imapconf_getstring(conf, "log_file");

    log_set_prefix(imapconf_getstring(conf, "syslog_prefix"));

    if (!path || !*path)
        return;
    if (log_set_file(path) < 0)
        log_warning("imapconf: cannot open log_file=<%s> error=<%s>",
                    path, strerror(errno));
}

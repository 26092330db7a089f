/*
 * master_conf.h - the cyrus.conf reader.
 *
 * Cyrus's syntax: sections START, SERVICES, EVENTS, DAEMON, each
 *     NAME {
 *         entry-name key=value key="value with spaces" ...
 *     }
 * '#' outside double quotes starts a comment to the end of the line,
 * anywhere on a line (also right after an unquoted value: cmd=x#y is
 * cmd=x).  An entry is one line; a line ending in '\' (blanks after it
 * allowed, not inside quotes) continues on the next.  Values may be
 * double-quoted (no escapes inside, as Cyrus; the quotes must enclose the
 * whole value); unquoted values end at white space and may not contain
 * '"'.  Single quotes are ordinary characters.  CRLF line ends are fine.
 * Section names ignore case; keys are lower case (anything else is an
 * unknown key).  "NAME {" must be alone on its line, as must "}".  Entry
 * names: letters, digits, '-', '_', at most 64 bytes.  Names are unique
 * within a section and across SERVICES/EVENTS/DAEMON (the status output
 * and reloads key on them); a START entry may share its name with an
 * entry of another section (Debian's stock cyrus.conf has delprune and
 * tlsprune in both START and EVENTS).
 *
 * Keys per section (unknown keys, or a key of another section: a warning
 * "FILE:LINE: unknown key K in SECTION entry N, ignored" via log_warning();
 * a known key given twice or with a bad value, a missing or empty cmd, a
 * missing listen in SERVICES, an unknown section, a line outside a
 * section, an unterminated quote or section, a NUL byte: an error
 * "FILE:LINE: ..." and the load fails):
 *   START     cmd
 *   SERVICES  cmd listen proto prefork maxchild maxforkrate maxfds babysit
 *             maxuses idletimeout backlog
 *             (maxuses/idletimeout: a child leaves after that many
 *             connections / seconds idle, 0 = never; passed to the child)
 *   EVENTS    cmd period(minutes) at(HHMM)  (exactly one of period/at)
 *   DAEMON    cmd
 * Ranges: prefork 0..MASTER_MAXCHILD_CAP, maxchild -1..MASTER_MAXCHILD_CAP,
 * maxforkrate 0..10000, maxfds 16..65536, backlog 1..65535, maxuses
 * 0..1000000, idletimeout 0..86400, period 1..525600, at 0000..2359 with
 * minutes < 60 (1 to 4 digits; stored as the number, 0401 -> 401).
 * Integers are plain decimal (no sign but maxchild's -1), quoted or not.
 * babysit takes 0/1/true/false/yes/no/on/off/t/f/y/n; as in Cyrus, babysit=1
 * raises prefork to at least 1 and sets maxforkrate 10 when it is 0 (the
 * stored values are the effective ones).
 * proto: tcp, tcp4 or tcp6 (stored lower case; "tcp" for SERVICES entries
 * without proto, NULL in other sections).  Cyrus's udp, udp4, udp6 are not
 * supported: such an entry is checked like any other, then dropped with a
 * warning "FILE:LINE: proto udp is not supported (service N), entry
 * ignored" (so a stock Debian cyrus.conf, whose notifyd uses udp, loads);
 * any other proto value is an error.
 * Defaults: prefork 0, maxchild -1, maxforkrate 0 (no cap), maxfds 256,
 * babysit 0, maxuses 250, idletimeout 0, backlog 0 (stored when absent:
 * the system maximum, net.core.somaxconn), proto tcp.
 * maxchild -1 (or absent) means no limit and is STORED as
 * MASTER_MAXCHILD_CAP: after a load maxchild is always 0..CAP (0: the
 * service never forks).  prefork > maxchild is an error.
 *
 * listen: "/path" (UNIX socket; shorter than sun_path), "host:port",
 * "[v6addr]:port", "*:port" or "port" (all addresses of proto), port
 * numeric 1..65535 or a service name.  Service names are kept as strings
 * and NOT resolved here (Debian's "imap" and "lmtp" are missing from some
 * /etc/services): the code that opens the socket resolves them.  An IPv6
 * literal with tcp4, or an IPv4 literal with tcp6, is an error.  IPv6
 * zone ids ("fe80::1%eth0") are not supported.
 *
 * Limits: file 1 MiB, 4096 entries, 64 words per logical line, values
 * 4096 bytes.  Every error message starts "FILE:LINE: " (the line where
 * the offending word or entry starts; for an unclosed section its "{"
 * line), except "FILE: cannot open/read: ..." and "FILE: file too large".
 */
#ifndef MASTER_MASTER_CONF_H
#define MASTER_MASTER_CONF_H

#include <stddef.h>

#define MASTER_MAXCHILD_CAP 1000

enum master_section {
    MASTER_SECTION_START,
    MASTER_SECTION_SERVICES,
    MASTER_SECTION_EVENTS,
    MASTER_SECTION_DAEMON
};

enum master_listen_kind {
    MASTER_LISTEN_UNIX,
    MASTER_LISTEN_TCP
};

struct master_entry {
    enum master_section section;
    char *name;
    char *cmd;                  /* the command line, as written (the value
                                 * without its enclosing quotes) */
    unsigned long line;         /* where it was defined */
    /* SERVICES */
    enum master_listen_kind listen_kind;
    char *listen;               /* as written */
    char *listen_host;          /* TCP: host or NULL for any; UNIX: the path */
    char *listen_port;          /* TCP: port or service name */
    char *proto;                /* "tcp", "tcp4", "tcp6" */
    int prefork, maxchild, maxforkrate, maxfds, babysit;
    int maxuses, idletimeout, backlog;
    /* EVENTS */
    int period;                 /* minutes, 0 when `at` is used */
    int at;                     /* HHMM, -1 when `period` is used */
};

struct master_conf {
    struct master_entry *entries;
    size_t nentries;
};

/* Parse a cyrus.conf.  0 and *conf_r (free with master_conf_free), or -1
 * with *conf_r NULL, *error_r ("FILE:LINE: what"; caller frees; error_r
 * may be NULL) and nothing else allocated.  Warnings go to log_warning().
 * Entries keep the file's order. */
int master_conf_load(const char *path, struct master_conf **conf_r,
                     char **error_r);
/* The same from memory (name used in messages). */
int master_conf_load_string(const char *name, const char *text, size_t len,
                            struct master_conf **conf_r, char **error_r);

/* The entry of that name, or NULL (also for NULL arguments).  When a
 * START entry shares its name with an entry of another section, the
 * other one is returned. */
const struct master_entry *master_conf_find(const struct master_conf *conf,
                                            const char *name);

/* 1 when two SERVICES entries need new sockets to change from a to b
 * (listen kind, listen as written, or proto differ: "143" and "imap"
 * count as different), 0 when only limits/cmd differ.  Entries of other
 * sections (listen and proto NULL) compare equal to each other. */
int master_conf_listen_differs(const struct master_entry *a,
                               const struct master_entry *b);

/* Split a command line into a NULL-terminated argv (white space
 * separated; double quotes group and are removed: a"b c"d -> "ab cd",
 * "" -> an empty word; the caller frees with master_conf_argv_free).
 * NULL for a NULL or blank cmd, an unterminated quote, or out of memory.
 * (A loaded entry's cmd always splits to at least one word.) */
char **master_conf_split_cmd(const char *cmd);
void master_conf_argv_free(char **argv);

/* Remove entry i (its strings freed; later entries move down one).
 * No-op when i is out of range. */
void master_conf_remove(struct master_conf *conf, size_t i);

/* Insert right after entry i a copy of it with another name and cmd
 * (both copied; the name is not checked).  0, or -1 when i is out of
 * range or memory ran out (conf unchanged). */
int master_conf_insert_copy(struct master_conf *conf, size_t i,
                            const char *name, const char *cmd);

void master_conf_free(struct master_conf **confp);

#endif

/*
 * imapconf.h - the imapd.conf reader.
 *
 * Cyrus syntax: one "key: value" per line, '#' starts a comment line, blank
 * lines ignored, surrounding white space trimmed.  Keys are known from one
 * table (imapconf.c) with their type and default; an unknown key gives a
 * warning naming file and line; a malformed value (bad number, bad boolean,
 * unknown backend name, unknown enum word) is an error naming file, line
 * and key.  Booleans: yes/no, on/off, true/false, 1/0 (any case).  Keys are
 * letters, digits, '-' and '_', and case-insensitive (stored lower-cased,
 * as Cyrus does).  Only whole lines starting with '#' are comments: a '#'
 * inside a value is part of it.  CRLF line endings are accepted.  A key
 * given twice: the last one counts, with a warning.
 *
 * Open-ended keys: "partition-NAME" for any NAME (the partition's
 * directory; an empty value is an error) and "sasl_*" (any name, any value,
 * kept for the SASL library; see imapconf_getsasl()).
 *
 * A loaded configuration is read-only and may be shared between threads
 * and inherited across fork().
 */
#ifndef LIB_IMAPCONF_H
#define LIB_IMAPCONF_H

#include <stddef.h>

enum imapconf_type {
    IMAPCONF_STRING,
    IMAPCONF_INT,      /* decimal, may be negative; range in the table */
    IMAPCONF_SWITCH,   /* boolean */
    IMAPCONF_DBNAME,   /* a cyrusdb backend name from the registry */
    IMAPCONF_ENUM      /* one of a list of words */
};

/* The default imapd.conf and cyrus.conf of every program (-C, -M):
 * SYSCONFDIR/cyrusdeliver/, compiled in from configure's sysconfdir
 * (/etc/cyrusdeliver in the Debian package).  A directory of our own, so
 * that the files sit beside a Cyrus installation's /etc/imapd.conf, and a
 * tool run without -C never reads Cyrus's configuration. */
#ifndef SYSCONFDIR
#define SYSCONFDIR "/etc"
#endif
#define IMAPCONF_DEFAULT_PATH SYSCONFDIR "/cyrusdeliver/imapd.conf"
#define IMAPCONF_DEFAULT_CYRUSCONF SYSCONFDIR "/cyrusdeliver/cyrus.conf"

/* The default configdirectory, LOCALSTATEDIR/lib/cyrusdeliver, compiled
 * in from configure's localstatedir (/var/lib/cyrusdeliver in the Debian
 * package; /usr/local/var/lib/cyrusdeliver for a plain ./configure).
 * Partitions have no default, as in Cyrus: a configuration names each one
 * (partition-default: LOCALSTATEDIR/spool/cyrusdeliver in the package's
 * and the sample imapd.conf); IMAPCONF_SUGGESTED_PARTITION is the path
 * cyr_info suggests when none is set. */
#ifndef LOCALSTATEDIR
#define LOCALSTATEDIR "/var"
#endif
#define IMAPCONF_DEFAULT_CONFIGDIR LOCALSTATEDIR "/lib/cyrusdeliver"
#define IMAPCONF_SUGGESTED_PARTITION LOCALSTATEDIR "/spool/cyrusdeliver"

struct imapconf;   /* a loaded configuration: opaque */

/*
 * Read `path`.  Returns 0 and *conf_r (free with imapconf_free()), or -1
 * with *conf_r = NULL and a message in *error_r (caller frees) of the form
 * "FILE:LINE: key KEY: ..." for a malformed value, "FILE:LINE: ..." for a
 * malformed line (no colon, invalid key, NUL byte), or "FILE: ..." when the
 * file cannot be read.  *error_r is NULL on success, and may be NULL on
 * failure only if memory ran out; error_r itself may be NULL.  Warnings
 * (unknown key, key given twice) go to log_warning() as
 * "FILE:LINE: unknown key KEY".  Files over 64 MiB are refused; there is
 * no limit on the length of a line.
 * Those two warnings are left out when the environment variable
 * CYRUSDELIVER_CONF_WARNED names this file (the same path, or the same
 * file by device and inode): the master sets it for every program it
 * starts, having logged the file's warnings itself, so that they appear
 * once per master start and not once per worker.  Errors are always
 * reported.
 */
int imapconf_load(const char *path, struct imapconf **conf_r, char **error_r);

/* Same, from a string in memory (name used in messages). */
int imapconf_load_string(const char *name, const char *text, size_t len,
                         struct imapconf **conf_r, char **error_r);

/* A configuration with every default and no file (NULL only when memory
 * runs out or a default in the table does not parse, which is logged). */
struct imapconf *imapconf_defaults(void);

/* Values: the file's value or the table's default.  Asking for a key not in
 * the table, or with the wrong type, is a programming error: it logs and
 * returns the zero value (NULL / 0).  Returned strings belong to conf.
 * imapconf_getstring() serves STRING keys, DBNAME keys (the backend name,
 * as in the registry) and ENUM keys (the word as spelt in the table, even
 * if the file used another case); imapconf_getenum() gives an ENUM key's
 * word as its index in the table's word list. */
const char *imapconf_getstring(const struct imapconf *conf, const char *key);

/* The server's name into out (len bytes, NUL-terminated): `servername`
 * when set, else the host name, else "localhost". */
void imapconf_servername(const struct imapconf *conf, char *out, size_t len);

/* For the daemons (lmtpd, imapd) once their configuration is loaded: tag
 * lines with `syslog_prefix` (log_set_prefix()), and when `log_file` is
 * set, log to that file from now on (log_set_file()); a file
 * that cannot be opened is logged as a warning and logging stays where it
 * was. */
void imapconf_log_file(const struct imapconf *conf);
long imapconf_getint(const struct imapconf *conf, const char *key);
int imapconf_getswitch(const struct imapconf *conf, const char *key);
int imapconf_getenum(const struct imapconf *conf, const char *key);

/* partition-NAME lookup (NAME case-insensitive): the path, or NULL if not
 * configured. */
const char *imapconf_partition(const struct imapconf *conf, const char *name);

/* A sasl_* key's value, e.g. imapconf_getsasl(conf, "sasl_pwcheck_method"):
 * the string (owned by conf), or NULL when the file does not set it or the
 * key does not start with "sasl_". */
const char *imapconf_getsasl(const struct imapconf *conf, const char *key);

/* Every key of conf, for the configuration tools (cyr_info): the
 * table's keys in table order, then the partition-NAME and sasl_* keys
 * of the file in file order.  fn gets the key, its value as the server
 * sees it (numbers in decimal, booleans "yes"/"no", backend names and
 * enum words as spelt in the table; strings as written), the table's
 * default (NULL for partition-NAME and sasl_*) and the line that set it
 * (0: not in the file, the default applies). */
typedef void imapconf_foreach_fn(void *rock, const char *key,
                                 const char *value, const char *def,
                                 unsigned long line);
void imapconf_foreach(const struct imapconf *conf, imapconf_foreach_fn *fn,
                      void *rock);

/* 1 when key (any case) is one the reader knows: in the table, or
 * partition-NAME, or sasl_*; else 0 (the server ignores it). */
int imapconf_is_known(const char *key);

/* Write every known key to stdout as "key: default  # description", the
 * description followed by the range or the allowed words, then one line
 * each for partition-NAME and sasl_*; for the tools' --help and the
 * documentation. */
void imapconf_print_table(void);

/* Free a configuration and set *confp to NULL (no-op when NULL). */
void imapconf_free(struct imapconf **confp);

#endif

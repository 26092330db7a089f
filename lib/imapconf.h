/*
 * imapconf.h - the imapd.conf reader.
 *
 * Cyrus syntax: one "key: value" per line, '#' starts a comment line, blank
 * lines ignored, surrounding white space trimmed.  Keys are known from one
 * table (imapconf.c) with their type and default; an unknown key gives a
 * warning naming file and line; a malformed value (bad number, bad boolean,
 * unknown backend name, unknown enum word) is an error naming file, line
 * and key.  Booleans: yes/no, on/off, true/false, 1/0.  Keys of the form
 * "partition-NAME" are accepted for any NAME.
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

struct imapconf;   /* a loaded configuration: opaque */

/*
 * Read `path`.  Returns 0 and *conf_r, or -1 with a message in *error_r
 * (caller frees) of the form "FILE:LINE: key KEY: ..." for a malformed value,
 * or "FILE: ..." when the file cannot be read.  Warnings for unknown keys go
 * to log_warning() as "FILE:LINE: unknown key KEY".
 */
int imapconf_load(const char *path, struct imapconf **conf_r, char **error_r);

/* Same, from a string in memory (name used in messages). */
int imapconf_load_string(const char *name, const char *text, size_t len,
                         struct imapconf **conf_r, char **error_r);

/* A configuration with every default and no file. */
struct imapconf *imapconf_defaults(void);

/* Values: the file's value or the table's default.  Asking for a key not in
 * the table, or with the wrong type, is a programming error: it logs and
 * returns the zero value (NULL / 0). */
const char *imapconf_getstring(const struct imapconf *conf, const char *key);
long imapconf_getint(const struct imapconf *conf, const char *key);
int imapconf_getswitch(const struct imapconf *conf, const char *key);

/* partition-NAME lookup: the path, or NULL if not configured. */
const char *imapconf_partition(const struct imapconf *conf, const char *name);

/* Write every known key with its value and default to stdout ("key: value"),
 * for the tools' --help and the documentation. */
void imapconf_print_table(void);

void imapconf_free(struct imapconf **confp);

#endif

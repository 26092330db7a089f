/*
 * sieve_ext.h - the extension registry: one id per "require" name.
 * sieve_ext_names[id] is the name; the order is the one sieve_extensions()
 * reports (the comparators always present come last and are not listed).
 */
#ifndef SIEVE_SIEVE_EXT_H
#define SIEVE_SIEVE_EXT_H

enum {
    EXT_NONE = -1,
    EXT_FILEINTO = 0, EXT_REJECT, EXT_EREJECT, EXT_ENVELOPE, EXT_IMAP4FLAGS,
    EXT_COPY, EXT_SUBADDRESS, EXT_RELATIONAL, EXT_CMP_NUMERIC, EXT_VACATION,
    EXT_VACATION_SECONDS, EXT_BODY, EXT_VARIABLES, EXT_MAILBOX, EXT_DATE,
    EXT_INDEX, EXT_EDITHEADER, EXT_DUPLICATE, EXT_IHAVE, EXT_ENVIRONMENT,
    EXT_INCLUDE, EXT_REGEX, EXT_SPECIALUSE, EXT_ENCODED,
    EXT_CMP_OCTET, EXT_CMP_CASEMAP,
    EXT_COUNT
};

/* the names, indexed by id; NULL after the last */
extern const char *const sieve_ext_names[EXT_COUNT + 1];

/* the id of a "require" name (exact, case-sensitive as RFC 5228 3.2
 * has it), or -1 */
int sieve_ext_lookup(const char *name);

#endif

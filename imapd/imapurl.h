/*
 * imapurl.h - IMAP URLs (RFC 5092) as CATENATE (RFC 4469) uses them: a
 * message or a part of one on this server.
 *
 * Forms taken:
 *
 *   imap://[user[;AUTH=mech]@]host[:port]/MAILBOX[;UIDVALIDITY=v]/;UID=u
 *       [/;SECTION=s][/;PARTIAL=o[.n]]       (absolute)
 *   /MAILBOX[;UIDVALIDITY=v]/;UID=u[...]     (absolute path: this server)
 *   ;UID=u[...]                              (relative to the mailbox
 *                                             selected, RFC 5092 7.1)
 *
 * MAILBOX and the section are percent-decoded; ";" in a name must be
 * written %3B.  The section is part numbers ("1.2") optionally followed by
 * HEADER, TEXT or MIME (after part numbers), or one of HEADER and TEXT
 * alone; HEADER.FIELDS and URLAUTH (";EXPIRE=", ";URLAUTH=") are refused
 * as unsupported.  Nothing here looks anything up: the caller decides
 * whether the host is this server and the user the one logged in.
 *
 * Library code: no exits, no logging; one thread per struct imapurl.
 */
#ifndef IMAPD_IMAPURL_H
#define IMAPD_IMAPURL_H

#include <stddef.h>
#include <stdint.h>

#include "store/message.h"

#define IMAPURL_MAX_PARTS 16

struct imapurl {
    char *user;             /* the URL's user, or NULL */
    char *host;             /* NULL: a path or relative URL */
    unsigned port;          /* 0: none given */
    char *mailbox;          /* NULL: relative (";UID=" form) */
    uint32_t uidvalidity;   /* 0: not given */
    uint32_t uid;
    int section_set;        /* a SECTION was given */
    uint32_t part[IMAPURL_MAX_PARTS];
    size_t npart;
    enum message_section_kind kind;
    int partial;            /* a PARTIAL was given */
    uint32_t origin;
    uint32_t count;         /* 0: to the end */
};

/* Parse `len` bytes at `s` into *u (zeroed first; free it with
 * imapurl_fini() in every case).  0, or -1 with *error_r set to a
 * static text (malformed, unsupported). */
int imapurl_parse(const char *s, size_t len, struct imapurl *u,
                  const char **error_r);

/* Free what imapurl_parse() allocated; *u is zeroed. */
void imapurl_fini(struct imapurl *u);

#endif

/*
 * sieve_msg.h - a struct sieve_message_ctx over a message held in memory,
 * for tools, tests and any caller that has the whole message at hand.
 *
 *   struct sieve_msg m;
 *   struct sieve_message_ctx ctx;
 *   sieve_msg_init(&m, bytes, len);
 *   m.env_from = "sender@example.org";       (NULL: no envelope from)
 *   strarray_append(&m.env_to, "user@example.com");
 *   sieve_msg_ctx(&m, &ctx);
 *   ... sieve_execute(script, &ctx, &acts, &err) ...
 *   sieve_msg_fini(&m);
 *
 * Header values are unfolded and trimmed; decoded values have RFC 2047
 * encoded words decoded (B and Q; UTF-8, US-ASCII, ISO-8859-1).  The
 * header is scanned once, at the first lookup, into an index of its
 * fields; each value is unfolded (and decoded) once, when first asked
 * for, and kept until sieve_msg_fini().  The body
 * test sees: :raw the bytes after the header; :text / :content the bodies
 * of the leaf parts of the top-level entity and of one level of
 * multipart (type text for :text; the listed types for :content, "" for
 * every part), with quoted-printable and base64 undone.
 *
 * The mailbox, duplicate and environment answers come from the lists in
 * the struct (filled by the caller); include answers from `scripts`
 * (name -> compiled script, personal and global alike).  The bytes must
 * stay valid until sieve_msg_fini().  Nothing here logs or exits.
 */
#ifndef SIEVE_SIEVE_MSG_H
#define SIEVE_SIEVE_MSG_H

#include "sieve/sieve.h"

#define SIEVE_MSG_VIEWS 8        /* names remembered by header_view() */
#define SIEVE_MSG_VIEW_NAME 32    /* longer names are looked up each time */

struct sieve_msg {
    const char *base;
    size_t len;
    size_t header_len;           /* bytes of the header incl. blank line */
    const char *env_from;        /* NULL: none */
    struct strarray env_to;
    struct strarray env_auth;
    struct strarray mailboxes;   /* existing mailboxes */
    struct strarray duplicates;  /* ids already seen */
    struct strarray environment; /* "name=value" items */
    struct strarray script_names;/* include: names ... */
    const struct sieve_script **scripts; /* ... and their scripts */
    time_t now;
    int zone_minutes;
    /* private: the header's fields, indexed at the first header lookup
     * (one scan per message, not one per test) */
    struct sieve_msg_field *fields;
    size_t nfields;
    int indexed;
    /* header_view()'s answers: the values of the last names asked
     * for, each name's at view[start, start + n) (a script asks for the
     * same few headers test after test); the table is emptied when full */
    const char **view;
    size_t view_len, view_cap;
    struct sieve_msg_view {
        char name[SIEVE_MSG_VIEW_NAME];
        size_t namelen, start, n;
    } views[SIEVE_MSG_VIEWS];
    size_t nviews;
};

/* Set up over len bytes at base (not copied). */
void sieve_msg_init(struct sieve_msg *m, const char *base, size_t len);

/* Fill ctx with callbacks reading m (ctx->rock = m). */
void sieve_msg_ctx(struct sieve_msg *m, struct sieve_message_ctx *ctx);

/* Free the lists and the header index (not the scripts). */
void sieve_msg_fini(struct sieve_msg *m);

#endif

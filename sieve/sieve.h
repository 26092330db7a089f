/*
 * sieve.h - the Sieve mail filtering language (RFC 5228 and extensions):
 * compile a script once, execute it per recipient, get back actions.
 *
 * Sieve decides, the store acts.  This library does no mail I/O of its
 * own: it never opens a mailbox, sends a message or touches a database.
 * sieve_execute() asks the caller, through the callbacks of a struct
 * sieve_message_ctx, for what the script wants to know about the message
 * (envelope, header fields, body, size, whether a mailbox exists, whether
 * an id was seen before), and returns an ordered list of actions (keep,
 * fileinto, redirect, reject, vacation, header edits, duplicate marks).
 * The delivery path carries them out inside its one durable commit.
 *
 * Life cycle:
 *
 *   struct sieve_script *s;
 *   if (sieve_compile(text, len, NULL, NULL, &s, &err) != SIEVE_OK)
 *       ... answer err ("line 3: unknown command \"fileint\"") ...
 *   for each recipient:
 *       struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
 *       rc = sieve_execute(s, &msgctx, &acts, &err);
 *       ... carry out acts.v[0 .. acts.count-1] in order ...
 *       sieve_actions_fini(&acts);
 *   sieve_script_free(&s);
 *
 * The compiled form (struct sieve_script) is a checked tree: every
 * command, test and tagged argument resolved, every string literal with
 * its encoded characters decoded and its variable references located, so
 * that execution never re-parses.  It is immutable after sieve_compile():
 * one script may be executed any number of times, by several threads at
 * once, and kept across deliveries (cache it by file and mtime).  It can
 * be stored and loaded again without parsing: sieve/sieve_bc.h.
 *
 * Extensions (the "require" names sieve_compile() accepts by default,
 * also returned by sieve_extensions(), e.g. for ManageSieve's SIEVE
 * capability):
 *
 *   fileinto reject ereject envelope imap4flags copy subaddress relational
 *   comparator-i;ascii-numeric vacation vacation-seconds body variables
 *   mailbox date index editheader duplicate ihave environment include
 *   regex special-use encoded-character
 *
 * (comparator-i;octet and comparator-i;ascii-casemap are always present,
 * may also be required, and are not listed.)
 *
 * Errors.  Every function returning int returns one of the SIEVE_* codes
 * below.  A compile error is reported in errmsg as "line N: reason" (one
 * line, no trailing newline; N counts from 1).  Runtime errors follow
 * RFC 5228 section 2.10.6: the actions gathered so far are dropped and the
 * result is a single implicit keep (so the mail is never lost), the code
 * is SIEVE_ERUNTIME and errmsg says "line N: reason".  A temporary failure
 * of a callback gives SIEVE_ETEMP: the caller should answer 4xx and try
 * the delivery again later; the action list is then empty.
 *
 * Memory: all strings handed out are owned by the structure that holds
 * them and freed by its _free/_fini function.  errmsg is a caller-owned
 * struct buf whose contents are replaced (it is reset first; left empty
 * on success).  Library code never exits or logs.
 */
#ifndef SIEVE_SIEVE_H
#define SIEVE_SIEVE_H

#include <stddef.h>
#include <time.h>

#include "lib/buf.h"
#include "lib/strarray.h"

/* ---- result codes ---------------------------------------------------- */

#define SIEVE_OK         0   /* success */
#define SIEVE_ESYNTAX   -1   /* compile: the script is not valid Sieve
                                (syntax, unknown or unrequired extension,
                                wrong argument); errmsg has the line */
#define SIEVE_ELIMIT    -2   /* compile: a limit of struct sieve_limits
                                passed (script size, nesting, strings) */
#define SIEVE_ENOMEM    -3   /* out of memory; nothing usable returned */
#define SIEVE_ERUNTIME  -4   /* execute: a runtime error (limit passed at
                                run time, failed include, bad regex...);
                                the actions are one implicit keep */
#define SIEVE_ETEMP     -5   /* execute: a callback reported a temporary
                                failure; no actions; try again later */
#define SIEVE_EINVAL    -6   /* bad arguments to the call itself */

/* A short constant English text for a code ("syntax error", ...). */
const char *sieve_strerror(int code);

/* ---- limits -------------------------------------------------------------
 *
 * Every limit of the implementation, in one place.  A NULL pointer or a
 * zero field means the default in brackets.  The compile-time limits
 * are checked by sieve_compile(); the run-time ones are copied into the
 * compiled script and checked by sieve_execute() (a script included at
 * run time runs under the limits of the top-level script).
 */
struct sieve_limits {
    size_t max_script_size;       /* bytes of script text [1 MiB] */
    unsigned max_nesting;         /* nested blocks plus nested tests
                                     (allof/anyof/not) [32] */
    size_t max_string_len;        /* bytes of one string literal [64 KiB] */
    unsigned max_actions;         /* actions one execution may collect,
                                     counting every include; the implicit
                                     keep is not counted [64] */
    unsigned max_redirects;       /* redirect actions per execution [4] */
    unsigned max_include_depth;   /* nested include levels [5] */
    unsigned max_includes;        /* include commands executed in all [32] */
    unsigned max_variables;       /* distinct variables per scope [128] */
    size_t max_variable_len;      /* bytes of one variable value, longer
                                     values are cut (RFC 5229 3) [4 KiB] */
    size_t max_match_len;         /* bytes of one value :matches / :regex
                                     compare; a longer value is a runtime
                                     error for :regex, and is cut for
                                     :matches [64 KiB] */
    unsigned long max_match_steps;/* steps of glob matching (pattern x
                                     value positions) and regex calls per
                                     execution, a runtime error when
                                     passed [10,000,000] */
    unsigned max_headers;         /* values fetched for one header name
                                     [1024]; more are ignored */
    unsigned long max_regex_cost; /* :regex keys: the sum over a script of
                                     the square of each key's positions
                                     once its repetitions are expanded
                                     (x{1,100}: 100 positions), about 8
                                     bytes of compiled form per unit; a
                                     key built at run time over it is a
                                     runtime error [1,000,000] */
};

/* Fill *l with the defaults (the bracketed values above). */
void sieve_limits_default(struct sieve_limits *l);

/* ---- extensions ------------------------------------------------------ */

/* The NULL-terminated list of extension names this implementation
 * supports (static storage, in the order of the list above). */
const char *const *sieve_extensions(void);

/* 1 when `name` is a supported extension (including the comparators
 * always present), else 0. */
int sieve_extension_supported(const char *name);

/* ---- compiling ----------------------------------------------------------
 *
 * Parse and check a script (RFC 5228 sections 2 and 8 grammar; text is
 * UTF-8 with CRLF or LF line ends; a NUL byte anywhere is a syntax
 * error).
 *
 *   text, len   the script; not NUL-terminated necessarily
 *   limits      NULL for the defaults
 *   allowed     extensions a "require" may name; NULL allows every
 *               supported one.  An extension not in this list is refused
 *               like an unknown one ("line N: unsupported extension ...")
 *   script_r    the compiled script on SIEVE_OK, else NULL
 *   errmsg      "line N: reason" on failure; may be NULL
 *
 * Checked at compile time: the grammar; unknown commands, tests and
 * tagged arguments; commands and tests of extensions not required
 * (require must come first, RFC 5228 3.2); argument counts and types;
 * conflicting or repeated tags; invalid comparators, relational
 * operators, address parts, date parts, variable names; regexes that do
 * not compile or use back-references; header field names given to
 * editheader; constant redirect addresses; the address test on a header
 * that holds no addresses (RFC 5228 5.1: From, To, Cc, Sender, Reply-To,
 * the Resent- fields, Return-Path, Delivered-To and the like); elsif/else
 * without if; an extension used outside the block of the "if ihave"
 * that enabled it.
 *
 * Returns SIEVE_OK, SIEVE_ESYNTAX, SIEVE_ELIMIT, SIEVE_ENOMEM or
 * SIEVE_EINVAL (text NULL with len > 0, or script_r NULL).
 */
struct sieve_script;

int sieve_compile(const char *text, size_t len,
                  const struct sieve_limits *limits,
                  const struct strarray *allowed,
                  struct sieve_script **script_r, struct buf *errmsg);

/* Free a compiled script and set *scriptp to NULL; NULL is a no-op. */
void sieve_script_free(struct sieve_script **scriptp);

/* The extensions the script requires, in the order named (owned by the
 * script).  ManageSieve can use it to report what a script needs. */
const struct strarray *sieve_script_requires(const struct sieve_script *s);

/* ---- the message, as the script sees it ------------------------------
 *
 * The caller fills one of these per recipient.  Every callback gets
 * `rock` as first argument.  Callbacks append their results to the
 * struct strarray or struct buf given (which arrive empty) and return
 *     0   on success (also when there is nothing to append),
 *    -1   on a temporary failure (sieve_execute() returns SIEVE_ETEMP),
 * except where said otherwise.  A NULL callback answers "nothing"
 * (no values, mailbox does not exist, not a duplicate, no environment
 * item, include fails).  Callbacks must not call sieve_execute()
 * recursively with the same action list.
 */
enum sieve_body_transform {
    SIEVE_BODY_RAW,       /* the undecoded body after the header */
    SIEVE_BODY_CONTENT,   /* decoded parts whose type matches `types` */
    SIEVE_BODY_TEXT       /* decoded text parts (the default) */
};

struct sieve_message_ctx {
    void *rock;

    /* Envelope addresses of part "from" (the reverse path, "" for the
     * null sender), "to" (the recipient this execution is for) or
     * "auth"; bare addresses, without <>. */
    int (*envelope)(void *rock, const char *part, struct strarray *values);

    /* Every value of header field `name` (case-insensitive), top to
     * bottom, unfolded.  decoded = 1: RFC 2047 encoded words decoded to
     * UTF-8 (what tests header/address/date compare); decoded = 0: raw
     * (for editheader's bookkeeping).  Header edits made by the script
     * are applied by the library on top of these values. */
    int (*header)(void *rock, const char *name, int decoded,
                  struct strarray *values);

    /* Optional (NULL: header() is used): the decoded values header()
     * would give, borrowed instead of copied: *values_r points at *n_r
     * strings the context owns, valid until the next call of
     * header_view() or the context's end.  A caller that replaces
     * header() replaces or clears this too (sieve_msg_ctx() sets both). */
    int (*header_view)(void *rock, const char *name,
                       const char *const **values_r, size_t *n_r);

    /* Body parts for the body test (RFC 5173): for SIEVE_BODY_CONTENT,
     * `types` holds the content types asked ("text", "text/html", ""
     * for every part); for the others it is NULL.  One entry per part
     * (SIEVE_BODY_RAW: exactly one). */
    int (*body)(void *rock, enum sieve_body_transform transform,
                const struct strarray *types, struct strarray *parts);

    size_t size;                  /* the message size in octets (size) */
    time_t now;                   /* currentdate, and the date of
                                     vacation bookkeeping; 0 = time() */
    int zone_minutes;             /* local zone offset of "now" from UTC,
                                     for currentdate and date :zone-less */

    /* mailboxexists (RFC 5490): 1 exists, 0 does not, -1 temporary. */
    int (*mailbox_exists)(void *rock, const char *mailbox);

    /* duplicate (RFC 7352): was this id (already qualified by handle,
     * see SIEVE_ACTION_DUPLICATE) marked before and not yet expired?
     * 1 yes, 0 no, -1 temporary failure. */
    int (*duplicate_check)(void *rock, const char *id);

    /* environment (RFC 5183): the value of item `name` ("domain",
     * "host", "location", "name", "phase", "remote-host", "remote-ip",
     * "version", or a vendor item).  Return 1 with the value in `value`,
     * 0 when the item is unknown, -1 temporary.  "name" and "version"
     * are answered by the library when the callback returns 0. */
    int (*environment)(void *rock, const char *name, struct buf *value);

    /* include (RFC 6609): find and compile the script `name` of the
     * user (global = 0, :personal) or the global scripts (global = 1).
     * Return 1 with *script_r set (the caller keeps ownership and keeps
     * it alive until sieve_execute() returns; a cache suits), 0 when it
     * does not exist, -1 temporary.  A script that fails to compile is a
     * runtime error of the including script: return 0 and let :optional
     * decide, or put the reason into `errmsg` and return 0.  Loops
     * (RFC 6609 3.2) are found by identity: an include answered with a
     * script that is still executing (the top-level one included) is a
     * runtime error, so answer the same script with the same pointer
     * (the top-level one too, when it can be included by name).  Every
     * include made counts for a later :once of the same (global, name). */
    int (*include)(void *rock, int global, const char *name,
                   const struct sieve_script **script_r, struct buf *errmsg);

    char subaddress_sep;          /* recipient_delimiter for :user /
                                     :detail (RFC 5233); 0 means '+' */
};

/* ---- actions ------------------------------------------------------------
 *
 * The result of one execution, in the order the script produced them
 * (RFC 5228 2.10.1: the order matters for redirect and header edits).
 * Duplicate actions are merged as RFC 5228 2.10.3 asks (a second fileinto
 * of the same mailbox, keep twice): the second adds its flags to the
 * first.  Header edits apply to the message as stored by every later
 * keep/fileinto and sent by redirect.
 */
enum sieve_action_type {
    SIEVE_ACTION_KEEP,        /* store in the default mailbox; implicit = 1
                                 when it is the implicit keep; flags */
    SIEVE_ACTION_DISCARD,     /* explicit discard (nothing to do; listed so
                                 the caller can log it) */
    SIEVE_ACTION_FILEINTO,    /* mailbox, flags, create, copy, specialuse */
    SIEVE_ACTION_REDIRECT,    /* address, copy */
    SIEVE_ACTION_REJECT,      /* text = reason; refuse with an MDN / DSN */
    SIEVE_ACTION_EREJECT,     /* text = reason; refuse at the protocol
                                 level when possible (LMTP 550) */
    SIEVE_ACTION_VACATION,    /* the auto-reply: see the vacation fields */
    SIEVE_ACTION_ADDHEADER,   /* name, text (value), last; Received and
                                 Auto-Submitted are never added or
                                 deleted (the commands are ignored) */
    SIEVE_ACTION_DELETEHEADER,/* name, index: delete the index-th (1-based,
                                 top to bottom) field of that name as the
                                 header stands after the edits before */
    SIEVE_ACTION_DUPLICATE    /* text = id to mark as seen for `seconds`
                                 once the delivery succeeded (RFC 7352);
                                 the id is "<length of handle>:" handle
                                 value (value: :uniqueid, or the first
                                 field named by :header, default
                                 Message-ID), the same string given to
                                 duplicate_check() */
};

struct sieve_action {
    enum sieve_action_type type;
    unsigned implicit:1;      /* KEEP: the implicit keep */
    unsigned copy:1;          /* FILEINTO, REDIRECT: :copy given */
    unsigned create:1;        /* FILEINTO: :create (RFC 5490) */
    unsigned mime:1;          /* VACATION: text is a MIME entity */
    unsigned last:1;          /* ADDHEADER: :last */
    unsigned line;            /* script line of the command (0: implicit) */
    char *mailbox;            /* FILEINTO */
    char *specialuse;         /* FILEINTO: :specialuse flag or NULL */
    struct strarray flags;    /* KEEP, FILEINTO: IMAP flags to set */
    char *address;            /* REDIRECT: the new recipient */
    char *text;               /* REJECT/EREJECT reason, VACATION body,
                                 ADDHEADER value, DUPLICATE id */
    char *name;               /* ADDHEADER, DELETEHEADER field name */
    unsigned index;           /* DELETEHEADER */
    /* VACATION (RFC 5230, RFC 6131): the caller answers the envelope
     * sender unless it is "", a list, an auto-reply or one of its own
     * addresses (RFC 5230 4.5, 4.6), and at most once per `seconds`
     * for the pair (sender, handle). */
    struct strarray addresses;/* :addresses, the user's other addresses */
    char *subject;            /* :subject or NULL (the caller makes
                                 "Auto: <original subject>") */
    char *from;               /* :from or NULL */
    char *handle;             /* :handle, or "vacation-<hash>" made from
                                 the reason, subject, from and :mime */
    unsigned long seconds;    /* VACATION: reply interval (:days 0 is
                                 one day; at most 90 days; :seconds may
                                 be 0); DUPLICATE: how long the mark
                                 lasts (default 7 days) */
};

struct sieve_actions {
    struct sieve_action *v;
    size_t count;
    size_t alloc;
};

#define SIEVE_ACTIONS_INITIALIZER { NULL, 0, 0 }

/* Free every action's strings and the array; leave it empty. */
void sieve_actions_fini(struct sieve_actions *acts);

/* Append the actions in the text form of the conformance corpus, one
 * line per action, e.g.
 *     keep :flags "\\Seen"              (implicit keep: "keep implicit")
 *     fileinto :create :copy "INBOX.x"
 *     redirect "a@example.org"
 *     reject "reason"
 *     vacation :days 7 :subject "..." "body"  (seconds: :seconds N)
 *     addheader :last "X-Name" "value"
 *     deleteheader "X-Name" 2
 *     duplicate "id" 604800
 * Strings are quoted as Sieve quoted strings (\\ and \" escaped).
 * 0, or -1 when the buffer cannot grow. */
int sieve_actions_format(const struct sieve_actions *acts, struct buf *out);

/* ---- executing ----------------------------------------------------------
 *
 * Run a compiled script against one message for one recipient and append
 * its actions to *acts (which should arrive empty).  The implicit keep
 * (RFC 5228 2.10.2) is decided here: unless a discard, fileinto, redirect
 * or reject without :copy cancelled it, or a keep was explicit, a KEEP
 * with implicit = 1 and the current imap4flags flags is appended last.
 *
 * Returns SIEVE_OK; SIEVE_ERUNTIME with the actions replaced by one
 * implicit keep and errmsg "line N: reason"; SIEVE_ETEMP with no actions;
 * SIEVE_ENOMEM (actions empty); SIEVE_EINVAL.
 *
 * Thread safety: several executions of one script may run at once; each
 * needs its own ctx and acts.  Nothing is cached between executions.
 */
int sieve_execute(const struct sieve_script *script,
                  const struct sieve_message_ctx *ctx,
                  struct sieve_actions *acts, struct buf *errmsg);

#endif

/*
 * imapparse.h - the IMAP command parser: reads one command from a
 * struct prot (RFC 3501 section 9 grammar, with LITERAL+ (RFC 7888),
 * UIDPLUS, MOVE, CONDSTORE, ENABLE, ID, IDLE, NAMESPACE, ACL, QUOTA,
 * LIST-EXTENDED (RFC 5258), LIST-STATUS (RFC 5819), CREATE-SPECIAL-USE
 * (RFC 6154), STATUS=SIZE (RFC 8438), BINARY's FETCH items (RFC 3516),
 * MULTIAPPEND (RFC 3502), CATENATE (RFC 4469), APPEND's literal8 (RFC
 * 3516) and UTF8 data (RFC 6855)) and turns its arguments into the
 * structures below, ready for imapd to execute.
 *
 * Use:
 *
 *     struct imapparse_cmd cmd;
 *     imapparse_cmd_init(&cmd);
 *     for (;;) {
 *         int r = imapparse_read(prot, &opts, &cmd);
 *         if (r == IMAPPARSE_OK)          execute cmd
 *         else if (imapparse_in_sync(r))  "TAG BAD text" (cmd.tag or "*",
 *                                          cmd.error); next command
 *         else                            close (EOF, error, desync)
 *     }
 *     imapparse_cmd_free(&cmd);
 *
 * Reading.  A command is its first line plus, for every literal {n} or
 * {n+} that ends a line, n bytes of literal data and the next line.
 * Before reading a synchronizing literal the parser calls the options'
 * continuation callback (which sends "+ Ready for more" or refuses); a
 * non-synchronizing literal is read at once.  Limits (struct
 * imapparse_options): the length of one line, of one literal, of an
 * APPEND message, of the whole command, the number of tokens and the
 * nesting of lists.  An oversized synchronizing literal is refused
 * BEFORE the client sends it.
 *
 * Staying in sync.  Every error result except IMAPPARSE_EOF,
 * IMAPPARSE_IOERROR, IMAPPARSE_TIMEOUT and IMAPPARSE_DESYNC leaves the
 * stream at the start of the next command: the rest of the erroneous
 * line is dropped, and when that line ends in a non-synchronizing
 * literal header {n+}, those n bytes and the line after them are
 * dropped too (repeatedly).  A line that ends in a synchronizing literal
 * header {n} ends the command: the client waits for "+" and gets the
 * BAD instead.  A line over the line limit is skipped through its LF
 * (prot_getline()); what it ended with is unknown, so a {n+} at the end
 * of such a line is not honoured (the data will then be parsed as
 * commands and answered BAD: the session lives on).  Dropping a
 * non-synchronizing literal stops after max_skip bytes with
 * IMAPPARSE_DESYNC: answer BYE and close.
 *
 * APPEND (with MULTIAPPEND, RFC 3502; CATENATE, RFC 4469; the literal8
 * of BINARY, RFC 3516; UTF8 (...) of UTF8=ACCEPT, RFC 6855).  Data
 * literals (a message, a CATENATE TEXT part) are NOT read by the parser:
 * the command is a series of events, each in cmd->append.event.
 * imapparse_read() returns the first (IMAPPARSE_APPEND_MESSAGE or
 * IMAPPARSE_APPEND_CATENATE), imapparse_append_next() each further one,
 * until IMAPPARSE_APPEND_END:
 *
 *     MESSAGE   a message literal: flags/date/utf8 of the message, size,
 *               nonsync, binary (literal8).  The continuation callback has
 *               been called for a synchronizing one (append = 1); the
 *               caller reads exactly `size` bytes (prot_read_some()),
 *               keeping or dropping them, before the next call.
 *     CATENATE  a CATENATE message begins (its flags and date are set);
 *               its parts follow:
 *     TEXT      a TEXT part literal: as MESSAGE (read its bytes)
 *     URL       a URL part: url, url_len (an astring)
 *     CATEND    the end of the CATENATE part list
 *     END       the end of the command line: nothing more to read
 *
 * Any result but IMAPPARSE_OK ends the command as imapparse_read()'s
 * would (in sync or not, imapparse_in_sync()); a data literal over
 * max_append is IMAPPARSE_TOOBIG.  A literal8 ~{n} is accepted only
 * where data goes; the caller refuses NULs in a non-literal8 literal
 * itself (it reads the bytes).  imapparse_append_end() is the
 * one-message form: the next event must be END, anything else is a BAD
 * "Junk after message literal" (with no continuation sent).
 *
 * Memory.  Everything a command refers to (strings, sets, lists, the
 * search tree) is owned by the struct imapparse_cmd and valid until the
 * next imapparse_read() on it or imapparse_cmd_free() (an APPEND's
 * mailbox, flags and URLs too: they are copied out of the token text,
 * which later events' lines may move; cmd->tokens are not).  Strings are
 * NUL-terminated; a string never contains NUL (a NUL inside a quoted
 * string or a literal is a BAD), so strlen() on them is safe, but the
 * length is given too.
 *
 * Nothing here exits or logs; one thread per struct imapparse_cmd.
 */
#ifndef IMAPD_IMAPPARSE_H
#define IMAPD_IMAPPARSE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lib/buf.h"
#include "lib/prot.h"

/* ---- results ------------------------------------------------------- */

enum imapparse_result {
    IMAPPARSE_OK = 0,
    /* Malformed command: answer "TAG BAD <cmd->error>" (tag "*" when
     * cmd->tag is NULL: the tag itself was missing or invalid).  In sync. */
    IMAPPARSE_BAD = 1,
    /* A limit was exceeded (line, literal, APPEND size, command size,
     * tokens, nesting): answer "TAG BAD <cmd->error>" (for APPEND the
     * session may prefer "NO [TOOBIG]").  In sync. */
    IMAPPARSE_TOOBIG = 2,
    /* The continuation callback refused a synchronizing literal; its text
     * is in cmd->error; the client has not sent the data.  In sync. */
    IMAPPARSE_REFUSED = 3,
    /* CHARSET other than US-ASCII / UTF-8 in SEARCH: answer
     * "TAG NO [BADCHARSET (US-ASCII UTF-8)] <cmd->error>".  In sync. */
    IMAPPARSE_BADCHARSET = 4,
    /* The connection is over: the peer closed it (EOF), it failed
     * (IOERROR), or it was silent for the prot timeout (TIMEOUT; the
     * session sends "* BYE Autologout"). */
    IMAPPARSE_EOF = -1,
    IMAPPARSE_IOERROR = -2,
    IMAPPARSE_TIMEOUT = -3,
    /* A non-synchronizing literal too large even to drop (max_skip): the
     * stream cannot be resynchronized; send "* BYE <cmd->error>" and
     * close. */
    IMAPPARSE_DESYNC = -4,
    /* Out of memory (cmd->error says so); the stream is not in sync. */
    IMAPPARSE_NOMEM = -5,
    /* prot_set_interrupt()'s check fired while the parser waited for
     * input.  Between commands nothing is lost; inside a command (after
     * a literal) the command is, and the stream is not in sync. */
    IMAPPARSE_INTERRUPTED = -6
};

/* 1 when the result leaves the stream at the start of the next command
 * (OK, BAD, TOOBIG, REFUSED, BADCHARSET), else 0. */
int imapparse_in_sync(int result);

/* ---- options and limits -------------------------------------------- */

/* Called before the data of a synchronizing literal of `size` bytes is
 * read (append = 1 for the APPEND message literal).  Return 0 after
 * sending "+ Ready for more" (flushed) to let the client send it, or
 * non-zero to refuse with *error_r set (a static or rock-owned text; the
 * parser copies it to cmd->error and returns IMAPPARSE_REFUSED). */
typedef int imapparse_continue_fn(void *rock, struct prot *p, size_t size,
                                  int append, const char **error_r);

struct imapparse_options {
    size_t max_line;        /* bytes of one line without CRLF; 0 = 65536 */
    size_t max_literal;     /* one literal other than the APPEND message;
                               0 = 65536 */
    size_t max_append;      /* the APPEND message; 0 = 64 MiB */
    size_t max_command;     /* lines + literals of one command (not the
                               APPEND message); 0 = 1 MiB */
    size_t max_skip;        /* non-sync literal bytes dropped to resync;
                               0 = 16 MiB */
    size_t max_tokens;      /* tokens of one command; 0 = 100,000 */
    unsigned max_depth;     /* nesting of lists and search keys; 0 = 32 */
    /* NULL: the parser itself writes "+ Ready for more\r\n" and flushes */
    imapparse_continue_fn *cont;
    void *rock;
};

/* ---- tokens (the lexical layer) ------------------------------------ */

enum imapparse_toktype {
    IMAPPARSE_TOK_ATOM = 1,     /* also NIL, numbers, \Flags, BODY[...]... */
    IMAPPARSE_TOK_QUOTED,       /* "..." with \" and \\ undone */
    IMAPPARSE_TOK_LITERAL,      /* {n} or {n+} and its data */
    IMAPPARSE_TOK_LPAREN,
    IMAPPARSE_TOK_RPAREN,
    IMAPPARSE_TOK_DATA          /* an APPEND data literal header ({n},
                                   ~{n}); its bytes are the caller's */
};

struct imapparse_token {
    enum imapparse_toktype type;
    size_t off;                 /* into the command's token text */
    size_t len;
    int glued;                  /* an atom that followed ")" without a
                                   space: only "]..." (BODY[HEADER.FIELDS
                                   (A B)]<0.10>) */
};

/* ---- structured arguments ------------------------------------------ */

/* A sequence set kept as written.  0 stands for "*" (the largest number
 * in use); lo may be larger than hi ("5:2" means 2:5).  "$" (SEARCHRES,
 * RFC 5182: the result the last SEARCH RETURN (SAVE) saved) is saved = 1
 * with no ranges: the session substitutes it (imapparse_seqset_contains()
 * never matches it). */
struct imapparse_range {
    uint32_t lo, hi;
};
struct imapparse_seqset {
    size_t n;
    struct imapparse_range *r;
    int saved;
};

/* 1 when num is in set, with "*" meaning max (RFC 3501 6.4.8: "*" is the
 * largest number in use, so with max 0 it matches nothing real). */
int imapparse_seqset_contains(const struct imapparse_seqset *set,
                              uint32_t num, uint32_t max);

/* A calendar date (SEARCH BEFORE/ON/SINCE/SENT*): year 1..9999, mon
 * 1..12, mday 1..31 (checked against the month). */
struct imapparse_date {
    int year, mon, mday;
};

/* A list of strings (flags, ENABLE capabilities, header field names...). */
struct imapparse_strlist {
    size_t n;
    const char **s;
};

/* One FETCH attribute. */
enum imapparse_fetch_kind {
    IMAPPARSE_FETCH_FLAGS = 1,
    IMAPPARSE_FETCH_INTERNALDATE,
    IMAPPARSE_FETCH_RFC822_SIZE,
    IMAPPARSE_FETCH_ENVELOPE,
    IMAPPARSE_FETCH_BODY,           /* BODY without section */
    IMAPPARSE_FETCH_BODYSTRUCTURE,
    IMAPPARSE_FETCH_UID,
    IMAPPARSE_FETCH_RFC822,
    IMAPPARSE_FETCH_RFC822_HEADER,
    IMAPPARSE_FETCH_RFC822_TEXT,
    IMAPPARSE_FETCH_MODSEQ,
    IMAPPARSE_FETCH_SECTION,        /* BODY[...] / BODY.PEEK[...] */
    IMAPPARSE_FETCH_BINARY,         /* BINARY[...] / BINARY.PEEK[...]
                                       (RFC 3516): parts only, partial */
    IMAPPARSE_FETCH_BINARY_SIZE     /* BINARY.SIZE[...]: parts only */
};

enum imapparse_section_text {
    IMAPPARSE_SECTION_ALL = 0,      /* BODY[] or BODY[1.2] */
    IMAPPARSE_SECTION_HEADER,
    IMAPPARSE_SECTION_HEADER_FIELDS,
    IMAPPARSE_SECTION_HEADER_FIELDS_NOT,
    IMAPPARSE_SECTION_TEXT,
    IMAPPARSE_SECTION_MIME          /* only after a part number */
};

#define IMAPPARSE_MAX_PARTS 50      /* part numbers in one section */

struct imapparse_fetch_att {
    enum imapparse_fetch_kind kind;
    /* IMAPPARSE_FETCH_SECTION, and for IMAPPARSE_FETCH_BINARY[_SIZE]
     * peek, nparts, parts, section ("1.2", "" for BINARY[]) and the
     * partial range (not for BINARY.SIZE): */
    int peek;                       /* BODY.PEEK, BINARY.PEEK */
    size_t nparts;                  /* part numbers 1.2.3, each >= 1 */
    uint32_t parts[IMAPPARSE_MAX_PARTS];
    enum imapparse_section_text text;
    struct imapparse_strlist fields;/* HEADER.FIELDS[.NOT], as sent */
    const char *section;            /* the normalized text between the
                                       brackets, upper-case, fields in
                                       upper case: "1.HEADER.FIELDS (FROM
                                       TO)", for the response */
    int partial;                    /* <origin.count> given */
    uint32_t origin, count;         /* count >= 1 */
};

struct imapparse_fetch {
    size_t n;
    struct imapparse_fetch_att *atts;   /* macros expanded */
    int changedsince_set;
    uint64_t changedsince;              /* (CHANGEDSINCE n), n >= 1 */
    int vanished;                       /* (... VANISHED), QRESYNC: only
                                           with CHANGEDSINCE */
};

/* SELECT/EXAMINE's (QRESYNC (uidvalidity modseq [known-uids]
 * [(known-sequence-set known-uid-set)])) (RFC 7162 3.2.5); the sets hold
 * no "*", "$" or 0. */
struct imapparse_qresync {
    int set;
    uint32_t uidvalidity;               /* >= 1 */
    uint64_t modseq;                    /* >= 1 */
    int has_known_uids;
    struct imapparse_seqset known_uids;
    int has_match;
    struct imapparse_seqset match_seqs, match_uids;
};

enum imapparse_store_op {
    IMAPPARSE_STORE_REPLACE = 0,    /* FLAGS */
    IMAPPARSE_STORE_ADD,            /* +FLAGS */
    IMAPPARSE_STORE_REMOVE          /* -FLAGS */
};

struct imapparse_store {
    enum imapparse_store_op op;
    int silent;                     /* .SILENT */
    struct imapparse_strlist flags; /* "\Seen" / keywords, as sent */
    int unchangedsince_set;
    uint64_t unchangedsince;        /* (UNCHANGEDSINCE n), may be 0 */
};

/* The SEARCH key tree. */
enum imapparse_skey {
    IMAPPARSE_S_AND = 1,    /* children[]: the top level and "(...)" */
    IMAPPARSE_S_OR,         /* children[0], children[1] */
    IMAPPARSE_S_NOT,        /* children[0] */
    IMAPPARSE_S_ALL,
    IMAPPARSE_S_SEQSET,     /* set: message numbers */
    IMAPPARSE_S_UID,        /* set: UIDs */
    /* flag keys: flag is the system flag ("\Answered"...) or keyword */
    IMAPPARSE_S_FLAG,       /* ANSWERED DELETED DRAFT FLAGGED SEEN KEYWORD */
    IMAPPARSE_S_UNFLAG,     /* UNANSWERED ... UNSEEN UNKEYWORD */
    IMAPPARSE_S_NEW,        /* RECENT and not SEEN */
    IMAPPARSE_S_OLD,        /* not RECENT */
    IMAPPARSE_S_RECENT,
    /* string keys: str */
    IMAPPARSE_S_BCC, IMAPPARSE_S_CC, IMAPPARSE_S_FROM, IMAPPARSE_S_TO,
    IMAPPARSE_S_SUBJECT, IMAPPARSE_S_BODY, IMAPPARSE_S_TEXT,
    IMAPPARSE_S_HEADER,     /* field and str */
    /* internal date keys: date */
    IMAPPARSE_S_BEFORE, IMAPPARSE_S_ON, IMAPPARSE_S_SINCE,
    /* Date: header keys: date */
    IMAPPARSE_S_SENTBEFORE, IMAPPARSE_S_SENTON, IMAPPARSE_S_SENTSINCE,
    /* size keys: number */
    IMAPPARSE_S_LARGER, IMAPPARSE_S_SMALLER,
    /* CONDSTORE: number = mod-sequence; field = entry name or NULL,
     * str = entry type ("priv"/"shared"/"all") or NULL */
    IMAPPARSE_S_MODSEQ,
    /* WITHIN (RFC 5032): number = seconds (>= 1) back from now */
    IMAPPARSE_S_OLDER, IMAPPARSE_S_YOUNGER
};

/* SEARCH RETURN options (ESEARCH, RFC 4731; SAVE: SEARCHRES, RFC 5182);
 * "RETURN ()" is ALL. */
#define IMAPPARSE_RET_MIN    0x01
#define IMAPPARSE_RET_MAX    0x02
#define IMAPPARSE_RET_ALL    0x04
#define IMAPPARSE_RET_COUNT  0x08
#define IMAPPARSE_RET_SAVE   0x10
#define IMAPPARSE_RET_PARTIAL 0x20  /* RFC 5267 4.4: partial_lo..hi */

struct imapparse_search {
    enum imapparse_skey key;
    size_t nchildren;
    struct imapparse_search **children;
    struct imapparse_seqset set;
    const char *flag;
    const char *field;
    const char *str;
    size_t str_len;
    struct imapparse_date date;
    uint64_t number;
};

/* SORT criteria (RFC 5256, DISPLAYFROM/DISPLAYTO of RFC 5957). */
enum imapparse_sortkey {
    IMAPPARSE_SORT_ARRIVAL = 1, IMAPPARSE_SORT_CC, IMAPPARSE_SORT_DATE,
    IMAPPARSE_SORT_FROM, IMAPPARSE_SORT_SIZE, IMAPPARSE_SORT_SUBJECT,
    IMAPPARSE_SORT_TO, IMAPPARSE_SORT_DISPLAYFROM, IMAPPARSE_SORT_DISPLAYTO
};

struct imapparse_sortcrit {
    enum imapparse_sortkey key;
    int reverse;
};

#define IMAPPARSE_MAX_SORT 16       /* criteria of one SORT */

/* THREAD algorithms (RFC 5256). */
enum imapparse_thread_alg {
    IMAPPARSE_THREAD_ORDEREDSUBJECT = 1,
    IMAPPARSE_THREAD_REFERENCES
};

/* STATUS items, in the order asked. */
enum imapparse_status_item {
    IMAPPARSE_STATUS_MESSAGES = 1,
    IMAPPARSE_STATUS_RECENT,
    IMAPPARSE_STATUS_UIDNEXT,
    IMAPPARSE_STATUS_UIDVALIDITY,
    IMAPPARSE_STATUS_UNSEEN,
    IMAPPARSE_STATUS_HIGHESTMODSEQ,
    IMAPPARSE_STATUS_DELETED,           /* RFC 9051 / RFC 9208 */
    IMAPPARSE_STATUS_DELETED_STORAGE,   /* RFC 9208 */
    IMAPPARSE_STATUS_SIZE,              /* RFC 8438 */
    IMAPPARSE_STATUS_APPENDLIMIT        /* RFC 7889 */
};

struct imapparse_status {
    size_t n;
    enum imapparse_status_item items[16];   /* a repeated item is BAD */
};

/* LIST-EXTENDED (RFC 5258) selection and return options, and RFC 6154's
 * SPECIAL-USE ones; RFC 5819's STATUS return option with its items. */
#define IMAPPARSE_LSEL_SUBSCRIBED      0x01
#define IMAPPARSE_LSEL_REMOTE          0x02
#define IMAPPARSE_LSEL_RECURSIVEMATCH  0x04
#define IMAPPARSE_LSEL_SPECIALUSE      0x08
#define IMAPPARSE_LRET_SUBSCRIBED      0x01
#define IMAPPARSE_LRET_CHILDREN        0x02
#define IMAPPARSE_LRET_SPECIALUSE      0x04
#define IMAPPARSE_LRET_STATUS          0x08
#define IMAPPARSE_LRET_MYRIGHTS        0x10   /* RFC 8440 */

struct imapparse_list {
    int extended;               /* selection options, several patterns or
                                   return options were written (even
                                   empty "()") */
    unsigned select;            /* IMAPPARSE_LSEL_* */
    unsigned ret;               /* IMAPPARSE_LRET_* */
    struct imapparse_strlist patterns;  /* at least one; [0] = arg[1] */
    struct imapparse_status status;     /* RETURN (STATUS (...)) items */
};

enum imapparse_append_event {
    IMAPPARSE_APPEND_MESSAGE = 1,
    IMAPPARSE_APPEND_CATENATE,
    IMAPPARSE_APPEND_TEXT,
    IMAPPARSE_APPEND_URL,
    IMAPPARSE_APPEND_CATEND,
    IMAPPARSE_APPEND_END
};

/* The current event of an APPEND and the message it belongs to. */
struct imapparse_append {
    enum imapparse_append_event event;
    unsigned nmsg;              /* messages begun so far (1 = the first) */
    /* the message: set at MESSAGE and CATENATE */
    struct imapparse_strlist flags;
    int flags_set;              /* a flag list was given (maybe empty) */
    int date_set;
    time_t date;                /* the date-time, as UTC seconds */
    int utf8;                   /* UTF8 (~{n}) message data (RFC 6855) */
    /* the data literal of MESSAGE and TEXT */
    size_t size;                /* its length */
    int nonsync;                /* it was {n+} / ~{n+} */
    int binary;                 /* it was a literal8 ~{n} (RFC 3516) */
    /* URL: the part's URL as sent (NUL-terminated, no NUL inside) */
    const char *url;
    size_t url_len;
};

/* ID: NIL (n = 0, nil = 1) or field/value pairs; a NIL value is NULL. */
struct imapparse_id {
    int nil;
    size_t n;
    const char **field;
    const char **value;
};

/* ---- the command --------------------------------------------------- */

/* Which arguments each command fills.  Mailbox names (arg[] of SELECT,
 * EXAMINE, CREATE, DELETE, RENAME, SUBSCRIBE, UNSUBSCRIBE, STATUS,
 * APPEND, COPY, MOVE) are astrings with "INBOX" in any case written
 * "INBOX", and the "INBOX." prefix of its children upper-cased (Cyrus's
 * rule; the hierarchy separator is "."); everything else is as sent.
 * LIST/LSUB: the reference is an astring, the pattern may hold % * ].
 * Commands without arguments refuse any with IMAPPARSE_BAD. */

enum imapparse_cmdid {
    IMAPPARSE_CMD_NONE = 0,
    /* any state */
    IMAPPARSE_CMD_CAPABILITY, IMAPPARSE_CMD_NOOP, IMAPPARSE_CMD_LOGOUT,
    IMAPPARSE_CMD_ID,               /* id */
    IMAPPARSE_CMD_ENABLE,           /* words: capabilities */
    /* not authenticated */
    IMAPPARSE_CMD_STARTTLS,
    IMAPPARSE_CMD_AUTHENTICATE,     /* arg[0] mechanism (upper-cased),
                                       arg[1] initial response or NULL */
    IMAPPARSE_CMD_LOGIN,            /* arg[0] user, arg[1] password */
    /* authenticated */
    IMAPPARSE_CMD_SELECT,           /* arg[0] mailbox; condstore */
    IMAPPARSE_CMD_EXAMINE,          /* arg[0] mailbox; condstore */
    IMAPPARSE_CMD_CREATE,           /* arg[0] mailbox; use, use_set
                                       (RFC 6154 "(USE (\Sent))") */
    IMAPPARSE_CMD_DELETE,           /* arg[0] mailbox */
    IMAPPARSE_CMD_RENAME,           /* arg[0] old, arg[1] new */
    IMAPPARSE_CMD_SUBSCRIBE,        /* arg[0] mailbox */
    IMAPPARSE_CMD_UNSUBSCRIBE,      /* arg[0] mailbox */
    IMAPPARSE_CMD_LIST,             /* arg[0] reference, arg[1] the
                                       first pattern; list (RFC 5258
                                       selection and return options,
                                       every pattern) */
    IMAPPARSE_CMD_LSUB,             /* arg[0] reference, arg[1] pattern */
    IMAPPARSE_CMD_STATUS,           /* arg[0] mailbox; status */
    IMAPPARSE_CMD_APPEND,           /* arg[0] mailbox; append */
    IMAPPARSE_CMD_NAMESPACE,
    IMAPPARSE_CMD_IDLE,
    IMAPPARSE_CMD_COMPRESS,         /* arg[0] mechanism (upper-cased) */
    /* selected */
    IMAPPARSE_CMD_CHECK, IMAPPARSE_CMD_CLOSE, IMAPPARSE_CMD_UNSELECT,
    IMAPPARSE_CMD_EXPUNGE,          /* UID EXPUNGE: set */
    IMAPPARSE_CMD_SEARCH,           /* search, charset, esearch,
                                       search_ret */
    IMAPPARSE_CMD_SORT,             /* esearch, search_ret, sort, nsort,
                                       charset (required), search */
    IMAPPARSE_CMD_THREAD,           /* thread_alg, charset (required),
                                       search */
    IMAPPARSE_CMD_FETCH,            /* set, fetch */
    IMAPPARSE_CMD_STORE,            /* set, store */
    IMAPPARSE_CMD_COPY,             /* set, arg[0] mailbox */
    IMAPPARSE_CMD_MOVE,             /* set, arg[0] mailbox */
    /* ACL (RFC 4314) and QUOTA (RFC 9208), authenticated; identifiers,
     * rights and resource words are astrings/atoms kept as sent */
    IMAPPARSE_CMD_SETACL,           /* arg[0] mailbox, words: identifier,
                                       rights */
    IMAPPARSE_CMD_DELETEACL,        /* arg[0] mailbox, words: identifier */
    IMAPPARSE_CMD_GETACL,           /* arg[0] mailbox */
    IMAPPARSE_CMD_LISTRIGHTS,       /* arg[0] mailbox, words: identifier */
    IMAPPARSE_CMD_MYRIGHTS,         /* arg[0] mailbox */
    IMAPPARSE_CMD_GETQUOTA,         /* arg[0] quota root */
    IMAPPARSE_CMD_GETQUOTAROOT,     /* arg[0] mailbox */
    IMAPPARSE_CMD_SETQUOTA          /* arg[0] quota root, words: resource
                                       name and limit (digits), in pairs;
                                       "()" gives none */
};

/* The name of command id (as the parser's table spells it), or NULL for
 * IMAPPARSE_CMD_NONE and ids past the last. */
const char *imapparse_cmd_name(int id);

struct imapparse_cmd {
    /* the raw command */
    const char *tag;                /* NULL when missing/invalid */
    const char *name;               /* upper-cased command name ("UID
                                       FETCH" for UID commands) or NULL */
    enum imapparse_cmdid id;
    int uid;                        /* "UID FETCH" etc. */
    const char *error;              /* text for BAD/NO/BYE on errors */
    size_t ntokens;                 /* the arguments as tokens */
    struct imapparse_token *tokens;
    struct buf text;                /* token bytes (NUL after each) */

    /* the arguments (which ones: see enum imapparse_cmdid) */
    const char *arg[2];
    size_t arg_len[2];
    int condstore;                  /* SELECT/EXAMINE (CONDSTORE) */
    struct imapparse_qresync qresync;   /* SELECT/EXAMINE (QRESYNC ...) */
    struct imapparse_seqset set;
    struct imapparse_fetch fetch;
    struct imapparse_store store;
    struct imapparse_search *search;
    int utf8;                       /* SEARCH CHARSET UTF-8 */
    int charset_set;                /* SEARCH CHARSET ... was written
                                       (RFC 6855: refused once UTF8=ACCEPT
                                       is enabled) */
    int esearch;                    /* SEARCH/SORT RETURN (...) given */
    unsigned search_ret;            /* its IMAPPARSE_RET_* options (no
                                       SAVE for SORT) */
    uint32_t partial_lo, partial_hi;    /* PARTIAL lo:hi, 1 <= lo <= hi,
                                           positions in the result */
    size_t nsort;                   /* SORT criteria */
    struct imapparse_sortcrit sort[IMAPPARSE_MAX_SORT];
    enum imapparse_thread_alg thread_alg;
    struct imapparse_status status;
    struct imapparse_list list;
    struct imapparse_strlist use;   /* CREATE (USE (...)), as sent */
    int use_set;                    /* USE was given (maybe empty) */
    struct imapparse_append append;
    struct imapparse_id idparams;
    struct imapparse_strlist words; /* ENABLE; ACL and QUOTA arguments */

    /* private */
    void *arena;
    size_t tokalloc;
    void *appst;                    /* APPEND's lexer between events */
    char errbuf[160];
};

void imapparse_cmd_init(struct imapparse_cmd *cmd);
/* Frees what the command owns; it may be init'ed/read into again. */
void imapparse_cmd_free(struct imapparse_cmd *cmd);

/* Read and parse one command (see the top of this file).  opts may be
 * NULL (all defaults).  Returns an enum imapparse_result; on anything but
 * IMAPPARSE_OK cmd->error is set, and cmd->tag/cmd->name when they were
 * read.  An empty line is IMAPPARSE_BAD with tag NULL. */
int imapparse_read(struct prot *p, const struct imapparse_options *opts,
                   struct imapparse_cmd *cmd);

/* The next event of an APPEND (see the top of this file), after the
 * caller has read the data of a MESSAGE or TEXT event.  IMAPPARSE_OK and
 * cmd->append.event, or an error result as imapparse_read()'s.  Calling
 * it for a command that is not an APPEND in progress, or after END or an
 * error: IMAPPARSE_BAD ("No APPEND in progress"). */
int imapparse_append_next(struct prot *p, const struct imapparse_options *opts,
                          struct imapparse_cmd *cmd);

/* After the caller has read the cmd->append.size bytes of a one-message
 * APPEND: read the rest of the command line.  IMAPPARSE_OK when it is
 * empty; IMAPPARSE_BAD ("Junk after message literal", the rest dropped
 * as described above) otherwise; IMAPPARSE_EOF, IMAPPARSE_IOERROR,
 * IMAPPARSE_TIMEOUT, IMAPPARSE_DESYNC as imapparse_read(). */
int imapparse_append_end(struct prot *p, const struct imapparse_options *opts,
                         struct imapparse_cmd *cmd);

/* ---- structured parsers on their own (also used by imapparse_read) -- */

/* A sequence set from text: "1", "*", "2:4", "1,3:*,7".  Numbers are
 * 1..4294967295.  0 or -1 (malformed).  set->r is malloc'd: free() it. */
int imapparse_seqset_parse(const char *s, size_t len,
                           struct imapparse_seqset *set);

/* A search date "1-Feb-2024" (also in quotes).  0 or -1. */
int imapparse_date_parse(const char *s, size_t len,
                         struct imapparse_date *date);

/* An RFC 3501 date-time "dd-Mon-yyyy hh:mm:ss +zzzz" (without the
 * quotes; the day may be " 1" or "01" or "1") to UTC seconds.  0 or -1. */
int imapparse_datetime_parse(const char *s, size_t len, time_t *t_r);

/* Days since 1970-01-01 of a date (for comparing against internal dates). */
long imapparse_date_days(const struct imapparse_date *date);

#endif

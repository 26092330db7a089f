/*
 * sieve_tree.h - the compiled form of a Sieve script, shared by the
 * parser (sieve_parse.c), the checker (sieve_check.c) and the executor
 * (sieve_exec.c).  Not a public interface: callers use sieve.h.
 *
 * The parser builds a generic tree (commands and tests with their raw
 * arguments); the checker resolves each node's name to an id, each tagged
 * argument into the node's option fields and each positional argument
 * into pos[], and decodes encoded characters.  After sieve_compile()
 * returns, nothing in the tree changes.
 */
#ifndef SIEVE_SIEVE_TREE_H
#define SIEVE_SIEVE_TREE_H

#include <regex.h>
#include <stddef.h>

#include "lib/buf.h"
#include "lib/strarray.h"
#include "sieve/sieve.h"

/* one string: the bytes (NUL-terminated, len authoritative) */
struct sv_str {
    char *s;
    size_t len;
    unsigned char has_var;   /* contains "${": expanded at run time */
    regex_t *re;             /* :regex key compiled at check time */
};

struct sv_strlist {
    struct sv_str *v;
    size_t n;
};

enum sv_argkind { SV_ARG_NUM, SV_ARG_STRLIST, SV_ARG_TAG };

struct sv_arg {
    enum sv_argkind kind;
    unsigned line;
    int is_list;             /* written with [ ] */
    char *tag;               /* SV_ARG_TAG: the identifier after ':' */
    unsigned long long num;  /* SV_ARG_NUM */
    struct sv_strlist sl;    /* SV_ARG_STRLIST */
};

/* comparators */
enum { SV_CMP_OCTET, SV_CMP_CASEMAP, SV_CMP_NUMERIC };
/* match types */
enum { SV_MATCH_IS, SV_MATCH_CONTAINS, SV_MATCH_MATCHES, SV_MATCH_REGEX,
       SV_MATCH_VALUE, SV_MATCH_COUNT };
/* relational operators */
enum { SV_REL_GT, SV_REL_GE, SV_REL_LT, SV_REL_LE, SV_REL_EQ, SV_REL_NE };
/* address parts */
enum { SV_ADDR_ALL, SV_ADDR_LOCAL, SV_ADDR_DOMAIN, SV_ADDR_USER,
       SV_ADDR_DETAIL };
/* set modifiers (bits) */
enum { SV_MOD_LOWER = 1, SV_MOD_UPPER = 2, SV_MOD_LOWERFIRST = 4,
       SV_MOD_UPPERFIRST = 8, SV_MOD_QUOTEWILDCARD = 16, SV_MOD_LENGTH = 32,
       SV_MOD_QUOTEREGEX = 64 };

struct sv_node {
    int id;                  /* SV_C_* / SV_T_* of sieve_check.c */
    unsigned line;
    char *name;
    struct sv_arg *args;
    size_t nargs;
    struct sv_node **tests;  /* the test or test list */
    size_t ntests;
    struct sv_node **block;
    size_t nblock;
    unsigned char test_list; /* ( ) given */
    unsigned char has_block;
    unsigned char unchecked; /* inside a failed ihave: a runtime error */

    /* resolved by the checker (the flags and enumerations in a byte
     * each: the tree of a loaded script is made per delivery) */
    unsigned char comparator, match, relop, addrpart;
    unsigned char has_match, has_comparator, has_addrpart;
    unsigned char last, originalzone, has_flags;
    unsigned char copy, create, mime, once, optional, global;
    unsigned char body_transform, has_seconds, over;
    unsigned modifiers;
    size_t npos;
    const struct sv_strlist *pos[3];
    unsigned long long index;   /* :index n (:last above) */
    const struct sv_str *zone;
    const struct sv_strlist *flags;
    const struct sv_str *specialuse, *subject, *from, *handle, *header,
                        *uniqueid;
    const struct sv_strlist *addresses, *content_types;
    unsigned long long seconds;
    unsigned long long number; /* size :over/:under limit */
};

/* a block of memory the decoder of the stored form (sieve_bc.c) carves
 * a whole tree from: one allocation for many nodes and strings */
struct sv_chunk {
    struct sv_chunk *next;
    size_t used, size;
    size_t cap;              /* bytes after the head (>= size: a block
                                kept from a freed tree may be larger) */
    /* the memory follows, 16-byte aligned */
};

/* sieve_bc.c: give back the block of a freed loaded tree.  One block per
 * thread (the largest, up to SV_CHUNK_KEEP bytes) is kept for the next
 * load, so that a worker loading a tree per delivery does not free and
 * allocate (and fault in) the same tens of kilobytes each time. */
#define SV_CHUNK_KEEP (256 * 1024)
void sv_chunk_release(struct sv_chunk *c);

/* a :regex key compiled when a stored form was loaded (regfree'd) */
struct sv_regex {
    regex_t re;
    struct sv_regex *next;
};

struct sieve_script {
    struct sv_node **cmds;
    size_t ncmds;
    struct strarray requires;
    struct sieve_limits limits;
    int uses_variables;
    /* set when the tree was loaded from its stored form: every node,
     * array and string of the tree lives in these chunks (freed as a
     * whole, the nodes are not walked), the regexes in the list */
    struct sv_chunk *chunks;
    struct sv_regex *regexes;
};

/* sieve_parse.c: text -> generic tree.  SIEVE_OK, SIEVE_ESYNTAX,
 * SIEVE_ELIMIT, SIEVE_ENOMEM; errmsg "line N: ..." */
int sieve_parse(const char *text, size_t len, const struct sieve_limits *l,
                struct sv_node ***cmds_r, size_t *ncmds_r,
                struct buf *errmsg);
void sieve_node_free(struct sv_node *n);

/* sieve_check.c: resolve and check the tree of a script */
int sieve_check(struct sieve_script *s, const struct strarray *allowed,
                struct buf *errmsg);

/* 0 when a checked node has the shape its command or test needs (the
 * number and kind of positional arguments, tests, block, enumerations in
 * range), else -1; for a tree that did not come from sieve_check() (the
 * stored form, sieve_bc.c) */
int sieve_check_shape(const struct sv_node *n, int in_test);

/* the name of the command or test of a checked node's id (NULL: not an
 * id the checker gives) */
const char *sieve_node_name(int id);

/* the limits of a compiled script: the defaults, overridden by the
 * non-zero fields of in (NULL: none) */
void sieve_limits_merge(struct sieve_limits *out,
                        const struct sieve_limits *in);

/* 1 when the address test may look at header `name` (RFC 5228 5.1) */
int sieve_check_address_header(const char *name);

/* command and test ids */
enum {
    SV_C_REQUIRE = 1, SV_C_IF, SV_C_ELSIF, SV_C_ELSE, SV_C_STOP, SV_C_KEEP,
    SV_C_DISCARD, SV_C_REDIRECT, SV_C_FILEINTO, SV_C_REJECT, SV_C_EREJECT,
    SV_C_SETFLAG, SV_C_ADDFLAG, SV_C_REMOVEFLAG, SV_C_VACATION, SV_C_SET,
    SV_C_ADDHEADER, SV_C_DELETEHEADER, SV_C_INCLUDE, SV_C_RETURN,
    SV_C_GLOBAL, SV_C_ERROR,
    SV_T_ADDRESS = 100, SV_T_ENVELOPE, SV_T_HEADER, SV_T_EXISTS, SV_T_SIZE,
    SV_T_ALLOF, SV_T_ANYOF, SV_T_NOT, SV_T_TRUE, SV_T_FALSE, SV_T_HASFLAG,
    SV_T_BODY, SV_T_STRING, SV_T_MAILBOXEXISTS, SV_T_DATE, SV_T_CURRENTDATE,
    SV_T_DUPLICATE, SV_T_IHAVE, SV_T_ENVIRONMENT, SV_T_VALID_EXT_LIST
};

/* sieve_match.c */
struct sv_matchctx {
    unsigned long *steps;          /* budget counter */
    unsigned long max_steps;
    size_t max_len;
    struct strarray *vars;         /* match variables out (may be NULL) */
    int error;                     /* set: 1 step budget, 2 too long,
                                      3 bad regex */
};
/* compare value with key under the node's comparator and match type
 * (not :count); 1 match, 0 no match, -1 error (mc->error set) */
int sieve_match(struct sv_matchctx *mc, int comparator, int match, int relop,
                const char *val, size_t vlen, const char *key, size_t klen,
                const regex_t *re);
/* i;ascii-numeric / ordering compare: <0, 0, >0 */
int sieve_cmp_order(int comparator, const char *a, size_t alen,
                    const char *b, size_t blen);
int sieve_relop_holds(int relop, int c);
/* glob match (* and ?), with optional captures; *steps counted */
int sieve_glob(const char *p, size_t plen, const char *s, size_t slen,
               int casemap, struct strarray *caps, unsigned long *steps,
               unsigned long max_steps);
/* Why a :regex key may not be given to regcomp() (NULL: it may):
 * a back-reference, groups nested over SIEVE_REGEX_MAX_DEPTH, or a cost
 * over max_cost.  The cost (*cost_r, also when refused) is the square of
 * the positions the key has once every repetition is expanded as glibc
 * expands it (x{2,4} is x x x? x?, x+ is x x*): the compiled form keeps,
 * per position, the set of positions reachable from it, about 8 bytes
 * per unit of cost.  a+++...+ or (a{1,999}){1,999} would take gigabytes
 * in regcomp(). */
#define SIEVE_REGEX_MAX_DEPTH 32
const char *sieve_regex_refusal(const char *p, size_t len,
                                unsigned long max_cost,
                                unsigned long *cost_r);

#endif

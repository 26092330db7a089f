/*
 * mailbench.h - what the parts of mailbench share: the options, the run
 * (targets, counters, per-user accounting, latency samples), one client
 * connection of the event loop, and the functions each part offers the
 * others.
 *
 * mailbench is one process with one thread: every connection is a
 * nonblocking socket (plain or TLS through OpenSSL) in one epoll loop and
 * a small state machine of its protocol.  The parts:
 *
 *   mailbench.c         main(), options, the loop, connection plumbing
 *                       (connect, buffered reads and writes, TLS)
 *   mailbench_lmtp.c    the LMTP client, the message bytes, the
 *                       verification accounting and `--verify cmd:`
 *   mailbench_imap.c    the IMAP sessions and the IMAP STATUS counts of
 *                       `--verify imap`
 *   mailbench_report.c  latency samples, percentiles, per-second series,
 *                       host figures from /proc, table / JSON / CSV, plot
 *
 * All memory allocation failures end the program (mailbench_oom()): this
 * is a tool, not a library.
 */
#ifndef TOOLS_MAILBENCH_H
#define TOOLS_MAILBENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <openssl/ssl.h>

#include "lib/buf.h"

#define MB_EXIT_OK 0        /* all good */
#define MB_EXIT_ERRORS 1    /* failed deliveries, protocol errors, mismatch */
#define MB_EXIT_SETUP 2     /* usage, or cannot start (connect, login) */

enum mb_mode { MB_MODE_LMTP, MB_MODE_IMAP, MB_MODE_MIXED };
enum mb_verify { MB_VERIFY_NONE, MB_VERIFY_IMAP, MB_VERIFY_CMD };

/* IMAP operations of --mix, in this order everywhere */
enum mb_op {
    MB_OP_FETCHHDR, MB_OP_FETCHBODY, MB_OP_STORE, MB_OP_SEARCH,
    MB_OP_EXPUNGE, MB_OP_APPEND, MB_OP_COUNT
};

/* latency metrics; the names are in mailbench_report.c */
enum mb_lat {
    MB_LAT_CONNECT, MB_LAT_LHLO, MB_LAT_MAIL, MB_LAT_RCPT, MB_LAT_DATA,
    MB_LAT_DELIVERY,
    MB_LAT_IMAP_CONNECT, MB_LAT_LOGIN, MB_LAT_SELECT, MB_LAT_UIDS,
    MB_LAT_FETCH_HDR, MB_LAT_FETCH_BODY, MB_LAT_STORE, MB_LAT_SEARCH,
    MB_LAT_EXPUNGE, MB_LAT_APPEND, MB_LAT_LOGOUT,
    MB_LAT_COUNT
};

/* named (non reply code) error kinds */
enum mb_err {
    MB_ERR_CONNECT, MB_ERR_CLOSED, MB_ERR_TIMEOUT, MB_ERR_PROTOCOL,
    MB_ERR_TLS, MB_ERR_IMAP_NO, MB_ERR_IMAP_BAD, MB_ERR_COUNT
};

struct mb_options {
    enum mb_mode mode;
    const char *lmtp_spec, *imap_spec;
    int lmtp_tls, lmtp_starttls, imap_tls, imap_starttls;
    unsigned conns;             /* -c */
    int quiet;                  /* -q */
    const char *json, *csv, *plot, *label;
    uint64_t seed;
    double timeout;             /* seconds without progress on a connection */
    /* lmtp */
    unsigned long msgs;         /* -n */
    unsigned long size;         /* -s */
    unsigned rcpts;             /* -r */
    unsigned long mailboxes;    /* -m (0 = msgs) */
    const char *user_fmt, *domain, *from, *lhlo;
    int from_each;              /* --from-each: sender mN.FROM per message */
    double dup_pct;
    double lmtp_rate;           /* --lmtp-rate: messages/s, 0 = as fast
                                 * as the server takes them */
    int one_per_conn;           /* -k */
    /* imap */
    unsigned sessions;
    unsigned long imap_n;
    unsigned long users;
    const char *password;
    int auth_plain;
    const char *mix;
    unsigned weights[MB_OP_COUNT];
    unsigned ops;
    /* verification */
    enum mb_verify verify;
    const char *verify_cmd;
    int dedup;
};

/* where to connect */
struct mb_target {
    const char *proto;              /* "LMTP" or "IMAP", for messages */
    const char *spec;               /* as given */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int tls;                        /* implicit TLS */
    int starttls;
    int ever_ready;                 /* one session got through its setup */
    unsigned failures_in_row;       /* connects that failed since a ready */
};

/* latency samples in microseconds, kept in full */
struct mb_samples {
    uint32_t *us;
    size_t n, cap;
};

/* per-second series: (completion second << 32 | latency in us) of each
 * event */
struct mb_series {
    uint64_t *v;
    size_t n, cap;
};

/* a snapshot of the host counters */
#define MB_MAX_DISKS 16
struct mb_host {
    unsigned long long cpu_user, cpu_sys, cpu_idle, cpu_iowait, cpu_total;
    unsigned ndisks;
    char disk_name[MB_MAX_DISKS][64];
    unsigned long long disk_wios[MB_MAX_DISKS];
    unsigned long long disk_wsect[MB_MAX_DISKS];
};

struct mb_conn;

/* what a protocol does with its connections */
struct mb_conn_ops {
    /* the connection is up (TCP, then TLS when implicit): expect the
     * greeting */
    void (*connected)(struct mb_conn *c);
    /* new input is in c's buffer: consume it with mailbench_conn_line()
     * and mailbench_conn_skip() */
    void (*input)(struct mb_conn *c);
    /* a STARTTLS handshake finished */
    void (*tls_ready)(struct mb_conn *c);
    /* everything queued was written */
    void (*sent)(struct mb_conn *c);
    /* the connection failed (connect error, EOF, error, timeout); it is
     * closed by the caller afterwards.  kind: an enum mb_err. */
    void (*failed)(struct mb_conn *c, int kind, const char *why);
};

/* one message on an LMTP connection */
struct mb_lmtp_msg {
    int active;
    unsigned long idx;      /* the message number (0-based) */
    unsigned long src;      /* its recipients and Message-ID come from src */
    int dup;                /* src != idx: a repeated Message-ID */
    unsigned replies;       /* replies seen of MAIL, RCPT..., DATA */
    unsigned accepted;      /* RCPTs answered 2xx */
    unsigned body_replies;  /* per-recipient replies after the data */
    int mail_code;
    int data_stage;         /* 0 before DATA's reply, 1 data sent, 2 done */
    int *code;              /* final reply code per recipient (0 none) */
    double t_mail, t_cmd, t_data_end;
    unsigned next_rcpt;     /* not pipelined: next RCPT to send */
};

struct mb_conn {
    struct mb_run *run;
    const struct mb_conn_ops *ops;
    struct mb_target *target;
    int kind;                   /* MB_CONN_* */
    int fd;
    SSL *ssl;
    int tls_state;              /* 0 plain, 1 handshaking, 2 up */
    int tls_implicit;
    int connected;              /* the TCP / UNIX connect completed */
    int dead;
    uint32_t events;            /* registered epoll events */
    int ssl_want_write;         /* an SSL read/handshake wants to write */
    /* input: bytes [in_off, in_len) are unread */
    char *in;
    size_t in_off, in_len, in_cap;
    /* output: out[out_off..] then ext[ext_off..ext_len) */
    struct buf out;
    size_t out_off;
    const char *ext;
    size_t ext_len, ext_off;
    double t_open, t_activity;
    struct mb_conn *next, *prev;    /* the run's list of open connections */
    int state;
    unsigned slot;
    unsigned long served;       /* messages or sessions done on it */
    int ready;                  /* got through greeting and setup */
    /* LMTP */
    int pipelining, cap_starttls;
    int paced;                  /* ready, its next message not due yet */
    struct mb_lmtp_msg msg;
    /* IMAP */
    unsigned long user;         /* 0-based user index */
    unsigned tag_sent, tag_done;
    int caps_known, cap_sasl_ir, cap_uidplus, cap_logindisabled;
    int in_cont;                /* the next line continues a response */
    size_t lit_left;            /* literal bytes still to skip */
    unsigned long exists;
    uint32_t *uids;
    size_t nuids, uids_cap;
    unsigned ops_left;
    int op;
    uint32_t op_uid;            /* the message of an expunge op */
    int got_status;             /* verify: STATUS answered */
    uint32_t status_messages;
    double t_cmd;
    unsigned long expunges;     /* untagged EXPUNGEs in this session */
};

#define MB_CONN_LMTP 1
#define MB_CONN_IMAP 2
#define MB_CONN_VERIFY 3

/* the counters of the LMTP part */
struct mb_lmtp {
    unsigned long next_msg;         /* next message number to send */
    unsigned long done;             /* finished, delivered or not */
    unsigned long delivered_msgs, delivered_rcpts, failed_msgs;
    unsigned long dups_sent, dups_delivered;
    unsigned long *sources;         /* fully delivered originals (dup pool) */
    size_t nsources;
    unsigned active;                /* connections open */
    unsigned connecting;            /* open, not ready yet */
    double t_start, t_end;
    double next_connect;            /* earliest time for the next connect */
    unsigned paced;                 /* ready connections held back by
                                     * --lmtp-rate */
    /* the message bytes */
    char *head_pre;                 /* Date, From */
    size_t head_pre_len;
    char *head_post[2];             /* Subject, Message-ID, end of header */
    size_t head_post_len[2];
    size_t post_subject_off[2], post_msgid_off[2];
    char *body;                     /* lines ending with ".\r\n" */
    size_t body_len;                /* without the final ".\r\n" */
};

/* the counters of the IMAP part */
struct mb_imap {
    unsigned long started, finished;    /* sessions */
    unsigned long ops, skipped, expunged, fetch_bytes;
    unsigned long failed_sessions;
    unsigned long *slot_round;          /* sessions started per slot */
    unsigned char *slot_busy;
    unsigned active;
    double t_start;
    double next_connect;
    int stop;                           /* start no more sessions */
    unsigned sessions;                  /* effective concurrency */
};

/* --verify: per user */
struct mb_verify_state {
    uint32_t *baseline, *found;
    int *known;                         /* found[u] valid in this phase */
    unsigned long next_user, done_users;
    unsigned active;
    double next_connect;
    int phase;                          /* 0 baseline, 1 after */
    unsigned long failures;
    unsigned long checked, mismatches;
    int ran;
};

struct mb_run {
    struct mb_options opt;
    int epfd;
    SSL_CTX *ssl_ctx;
    struct mb_target lmtp_target, imap_target;
    char hostname[256];
    uint64_t rng;
    struct mb_conn *conns;              /* open connections */
    struct mb_conn *dead;               /* closed, freed after the batch */
    double now;
    int progress;                       /* print the live line */
    double next_progress;
    const char *phase_name;
    /* a setup error (exit 2) or an abort (exit 1), with its message */
    int fatal;
    char fatal_msg[512];
    /* users of the LMTP part: M names */
    unsigned long nusers;
    char **user_names;
    uint32_t *expect_add;               /* messages expected per user */
    uint32_t *expunged;                 /* per user, counted by IMAP */
    /* errors */
    unsigned long err_code[1000];
    unsigned long err_kind[MB_ERR_COUNT];
    struct mb_lmtp lmtp;
    struct mb_imap imap;
    struct mb_verify_state verify;
    struct mb_samples lat[MB_LAT_COUNT];
    struct mb_series lmtp_series, imap_series;
    double t_run_start, t_run_end;
    struct mb_host host_start, host_end;
    double load[3];
    unsigned long warnings;
    double self_cpu_s;
};

/* ---- mailbench.c: plumbing ------------------------------------------- */

/* Exit with a message when memory runs out. */
void mailbench_oom(void) __attribute__((noreturn));
void *mailbench_malloc(size_t n);
void *mailbench_realloc(void *p, size_t n);
char *mailbench_strdup(const char *s);

/* Seconds on the monotonic clock. */
double mailbench_now(void);

/* A uniformly distributed random number (the seeded generator of the run). */
uint64_t mailbench_random(struct mb_run *run);

/* Stop the run: a setup error (code MB_EXIT_SETUP) or an abort
 * (MB_EXIT_ERRORS), with a message for stderr. */
void mailbench_fatal(struct mb_run *run, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An error message on stderr (the first 20 of a run; then a count). */
void mailbench_warn(struct mb_run *run, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A printable copy of network bytes for a message (at most outlen-1). */
const char *mailbench_printable(const char *s, size_t len, char *out,
                                size_t outlen);

/* Count an error: a reply code (100..999) or a kind (enum mb_err). */
void mailbench_error_code(struct mb_run *run, int code);
void mailbench_error_kind(struct mb_run *run, int kind);
unsigned long mailbench_error_total(const struct mb_run *run);

/* Open a connection to target (nonblocking).  Returns 0 and the connection
 * in *c_r (its ops->connected follows, or ops->failed), 1 when a UNIX
 * socket's backlog is full (try again a little later), -1 when the
 * connect failed at once (ops are not called; the error is counted and,
 * when the target never worked, the run stops with a setup error). */
int mailbench_conn_open(struct mb_run *run, struct mb_target *target,
                        int kind, const struct mb_conn_ops *ops,
                        struct mb_conn **c_r);

/* Queue bytes for writing (copied); a printf form; an external segment
 * (not copied: it must stay valid until written) that follows the queued
 * bytes.  mailbench_conn_flush() writes what it can now. */
void mailbench_conn_write(struct mb_conn *c, const void *data, size_t len);
void mailbench_conn_printf(struct mb_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mailbench_conn_write_ext(struct mb_conn *c, const char *data,
                              size_t len);
void mailbench_conn_flush(struct mb_conn *c);

/* The next input line, without its CR LF: 1 and (*line_r, *len_r) valid
 * until the next call, 0 when no whole line is buffered. */
int mailbench_conn_line(struct mb_conn *c, const char **line_r,
                        size_t *len_r);

/* Consume up to n buffered input bytes; returns how many. */
size_t mailbench_conn_skip(struct mb_conn *c, size_t n);

/* Start TLS on an established connection (after a STARTTLS reply);
 * ops->tls_ready follows, or ops->failed. */
void mailbench_conn_starttls(struct mb_conn *c);

/* Close and forget the connection (freed after the current batch of
 * events; ops are not called again). */
void mailbench_conn_close(struct mb_conn *c);

/* Count and close: ops->failed(c, kind, why), then close. */
void mailbench_conn_fail(struct mb_conn *c, int kind, const char *why);

/* ---- mailbench_lmtp.c ------------------------------------------------ */

/* Build the message bytes and the user names; 0, or -1 with a message in
 * the run (setup error). */
int mailbench_lmtp_init(struct mb_run *run);
/* Open connections while work remains; 1 while the LMTP part runs. */
int mailbench_lmtp_pump(struct mb_run *run);
/* --lmtp-rate: milliseconds (at most max_ms) until the next message is
 * due */
int mailbench_lmtp_due_ms(const struct mb_run *run, int max_ms);
void mailbench_lmtp_free(struct mb_run *run);
/* The user name of a 0-based index with --user (caller frees). */
char *mailbench_user_name(const struct mb_run *run, unsigned long idx);
/* --verify cmd:PROGRAM: one count of every user into verify.found;
 * returns 0, or -1 (the run's fatal message says why). */
int mailbench_verify_cmd(struct mb_run *run);
/* Compare baseline + expected with found; prints mismatches. */
void mailbench_verify_compare(struct mb_run *run);

/* ---- mailbench_imap.c ------------------------------------------------ */

void mailbench_imap_init(struct mb_run *run);
/* Start sessions while work remains; 1 while the IMAP part runs. */
int mailbench_imap_pump(struct mb_run *run);
/* --verify imap: the count of one phase; 1 while it runs. */
int mailbench_verify_pump(struct mb_run *run);
void mailbench_imap_free(struct mb_run *run);

/* ---- mailbench_report.c ---------------------------------------------- */

const char *mailbench_lat_name(const struct mb_run *run, int lat);
void mailbench_sample_add(struct mb_samples *s, double seconds);
void mailbench_series_add(struct mb_series *s, double at, double seconds);
void mailbench_host_read(struct mb_host *h);
void mailbench_progress(struct mb_run *run, int final);
/* The table on stdout, then --json, --csv, --plot; 0, or -1 when an
 * output could not be written (message on stderr). */
int mailbench_report(struct mb_run *run);
void mailbench_report_free(struct mb_run *run);

#endif

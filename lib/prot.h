/*
 * prot.h - the protocol stream of a server connection: buffered reads and
 * writes on a socket, plain or TLS (OpenSSL), with bounded lines and an
 * inactivity timeout.  lmtpd and imapd talk to their clients only through
 * this.
 *
 * One struct prot per connection, used by one thread.  It does not own the
 * descriptor (service_main closes it).
 *
 * Reading: an input buffer of PROT_BUFSIZE bytes.  prot_getline() returns
 * one line with its end (CRLF or a bare LF) removed and tells which end it
 * had; a line longer than the caller's limit is reported as
 * PROT_TOOLONG and the rest of that line is skipped (read and thrown away
 * up to and including its LF) so the next call starts on the next line.
 * Reads wait at most the timeout set with prot_settimeout() for data
 * (poll()); then PROT_TIMEOUT.  The peer closing the connection gives
 * PROT_EOF (a last line without LF is also returned as PROT_EOF, with
 * what was read in *line: the caller decides).
 *
 * Writing: output is buffered and sent by prot_flush(), or when the buffer
 * fills.  A write error or timeout is sticky: later writes are dropped and
 * prot_flush() returns the error.  SIGPIPE must be ignored by the process
 * (service_main does).
 *
 * TLS: prot_starttls() performs the server handshake on the connection;
 * everything after it is encrypted.  Bytes the client sent after the
 * STARTTLS command line but before the handshake (a command injection
 * attempt, RFC 3207 section 4.2 / RFC 2595) are discarded: the input
 * buffer is emptied before the handshake, and prot_starttls() reports
 * how many bytes it threw away in *discarded_r.
 *
 * Compression: prot_compress_start() turns on COMPRESS=DEFLATE (RFC
 * 4978) in both directions: raw deflate (no zlib header, 32 KiB window),
 * every prot_flush() ending in a Z_SYNC_FLUSH so the peer can inflate
 * all that was sent.  Under TLS the TLS records carry the compressed
 * stream; TLS cannot start once compression is on.  Inflating is
 * bounded: one read never produces more than the free space of the
 * input buffer, so the line limit of prot_getline() and the byte counts
 * of prot_read() hold for the inflated bytes as they do without
 * compression.  Compressed data the peer sent before compression
 * started on this side (pipelined after its command) is kept and
 * inflated.  prot_bytes_in()/prot_bytes_out() count the compressed bytes.
 *
 * Errors are returned as enum prot_result; a human-readable reason of the
 * last error is in prot_error() (for logs; never sent to the client).
 */
#ifndef LIB_PROT_H
#define LIB_PROT_H

#include <stddef.h>
#include <sys/types.h>

#include "lib/buf.h"

#define PROT_BUFSIZE 65536

enum prot_result {
    PROT_OK = 0,
    PROT_EOF = -1,        /* the peer closed the connection */
    PROT_TIMEOUT = -2,    /* nothing arrived / could be sent in time */
    PROT_TOOLONG = -3,    /* line longer than the limit (rest skipped) */
    PROT_IOERROR = -4,    /* read/write error, TLS error */
    PROT_NOMEM = -5,
    PROT_INTERRUPTED = -6 /* the interrupt check asked to stop waiting */
};

enum prot_eol {
    PROT_EOL_CRLF = 0,    /* the line ended in CR LF */
    PROT_EOL_LF = 1,      /* a bare LF */
    PROT_EOL_NONE = 2     /* no end (EOF, or the line was too long) */
};

struct prot;
struct tls_server;        /* lib/tls.h */

/* A stream on the connected socket fd (borrowed).  NULL when out of
 * memory. */
struct prot *prot_new(int fd);
/* A stream without a connection, for parsers fed from memory (fuzz
 * targets, tests): reads return a copy of data[0 .. len) and then
 * PROT_EOF; output is accepted and thrown away (prot_flush() returns
 * PROT_OK); no TLS.  NULL when out of memory. */
struct prot *prot_new_mem(const void *data, size_t len);
/* Frees the stream (and its TLS session, after sending close_notify when
 * possible); does not close fd.  Sets *pp NULL; no-op on NULL. */
void prot_free(struct prot **pp);

/* Seconds a read or a flush may wait (0 = forever).  Default 0. */
void prot_settimeout(struct prot *p, int seconds);

/* While check is set, a read that has to wait for input returns
 * PROT_INTERRUPTED as soon as check() returns non-zero (asked before each
 * wait and after a signal interrupts it; every signal is blocked from the
 * check until the wait has begun, so one that comes in between ends the
 * wait at once, and nothing wakes the process periodically): how an
 * idle connection learns that the process is shutting down (lmtpd sets
 * service_stopping between commands, never inside a message).  Nothing
 * buffered is lost; the caller decides what to do.  NULL clears. */
void prot_set_interrupt(struct prot *p, int (*check)(void));

/* A descriptor (an inotify or event descriptor; -1 = none, the default)
 * watched beside the connection while check (above) is set: when it
 * becomes readable the check is asked again, so an event wakes the wait
 * at once and no periodic wake-up is needed.  The check must consume
 * what made it readable, or the wait spins. */
void prot_set_wakefd(struct prot *p, int fd);

/* One line of at most maxlen bytes (without its end) into line (reset
 * first; NUL-terminated by buf; the line may itself contain NUL bytes:
 * use line->len).  *eol_r (may be NULL) gets how it ended, for PROT_OK
 * and PROT_TOOLONG alike (PROT_EOL_NONE otherwise).  PROT_OK, PROT_EOF
 * (line may be non-empty: a last line without LF), PROT_TIMEOUT,
 * PROT_TOOLONG (the line's first maxlen bytes are in line, the rest was
 * skipped through its LF; or PROT_EOF/PROT_TIMEOUT came first while
 * skipping: then that is returned), PROT_IOERROR, PROT_NOMEM. */
int prot_getline(struct prot *p, struct buf *line, size_t maxlen,
                 enum prot_eol *eol_r);

/* The next line without a copy, when the buffer already holds all of it
 * (through its LF) and it has at most maxlen bytes without its end:
 * *line_r points at it inside the stream's buffer (valid until the next
 * call that reads from p), *len_r counts its bytes WITH the end, *eol_r
 * is PROT_EOL_CRLF or PROT_EOL_LF; the line is consumed and 1 returned.
 * Otherwise nothing is consumed and 0 returned: prot_getline() does the
 * rest (waiting, overlong lines).  Never reads from the connection. */
int prot_getline_view(struct prot *p, size_t maxlen, const char **line_r,
                      size_t *len_r, enum prot_eol *eol_r);

/* Exactly len bytes (for BDAT chunks, IMAP literals) appended to out; or,
 * with out NULL, read and thrown away.  PROT_OK, PROT_EOF (fewer arrived),
 * PROT_TIMEOUT, PROT_IOERROR, PROT_NOMEM. */
int prot_read(struct prot *p, struct buf *out, size_t len);
/* Up to max bytes appended to out (whatever is buffered, else one read
 * from the connection); *n_r gets the count.  PROT_OK (n >= 1), PROT_EOF,
 * PROT_TIMEOUT, PROT_IOERROR, PROT_NOMEM.  For streaming large data. */
int prot_read_some(struct prot *p, struct buf *out, size_t max, size_t *n_r);
/* 1 when input is already buffered (the client pipelined more), else 0.
 * Does not read from the socket.  Compressed input not yet inflated
 * does not count. */
int prot_pending(const struct prot *p);

/* Read what has arrived, without waiting, and say whether prot_getline()
 * can now return without waiting for the connection: 1 when a whole line
 * is buffered, when the peer closed the connection or a read failed (the
 * next read reports it), or when the buffer is full without a line end
 * (then prot_getline() skips the rest of the overlong line, which may
 * wait); 0 when the line is not complete yet.  For a process that serves
 * several connections and waits in poll() between their commands: after
 * 0 the connection's socket polls readable when more arrives (TLS bytes
 * already received are moved out of the TLS layer first). */
int prot_line_ready(struct prot *p);

/* Buffered output. */
void prot_write(struct prot *p, const void *data, size_t len);
void prot_puts(struct prot *p, const char *s);
void prot_printf(struct prot *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Send everything buffered.  PROT_OK, PROT_TIMEOUT, PROT_IOERROR (sticky). */
int prot_flush(struct prot *p);

/* Server side TLS handshake with the given context (lib/tls.h).  Output
 * buffered so far is flushed first (the "220 ready" reply goes out in
 * plain text), buffered input is discarded (*discarded_r, may be NULL,
 * gets its size).  PROT_OK; PROT_IOERROR (handshake failed: the
 * connection must be closed; prot_error() says why), PROT_TIMEOUT. */
int prot_starttls(struct prot *p, struct tls_server *tls,
                  size_t *discarded_r);
/* Client side TLS handshake on a stream this process connected (lib/tls.h
 * tls_client_new()): the peer's certificate must verify and name
 * hostname (SNI is sent too).  Buffered output is flushed first;
 * buffered input must be empty (the server's reply to STARTTLS is the
 * last plain line).  PROT_OK; PROT_IOERROR (handshake or verification
 * failed; prot_error() says why), PROT_TIMEOUT. */
struct tls_client;
int prot_starttls_client(struct prot *p, struct tls_client *tls,
                         const char *hostname);
/* 1 after a successful prot_starttls() or prot_starttls_client(). */
int prot_is_tls(const struct prot *p);
/* "TLSv1.3 TLS_AES_256_GCM_SHA384" style text for logs and Received
 * headers, or NULL without TLS.  Owned by p. */
const char *prot_tls_info(const struct prot *p);
/* Bits of the negotiated cipher (SASL's SSF), 0 without TLS. */
int prot_tls_ssf(const struct prot *p);

/* Start COMPRESS=DEFLATE in both directions (see above): output
 * buffered so far (the OK of the COMPRESS command) is flushed
 * uncompressed first; input still buffered is taken as compressed.
 * PROT_OK; PROT_IOERROR (already active, or a memory stream), PROT_NOMEM,
 * or the flush's error. */
int prot_compress_start(struct prot *p);
/* 1 after a successful prot_compress_start(). */
int prot_is_compressed(const struct prot *p);

/* Why the last call failed, for logs.  Owned by p. */
const char *prot_error(const struct prot *p);

/* Bytes read from / written to the connection so far (plain side of
 * TLS; compressed when compression is on). */
unsigned long long prot_bytes_in(const struct prot *p);
unsigned long long prot_bytes_out(const struct prot *p);

#endif

/*
 * log.h - one set of logging functions for every program.
 *
 * Messages go to syslog (facility mail), to stderr or to a file (the
 * imapd.conf key log_file: log_set_file()), chosen by log_init().  When
 * syslog is asked for but nothing listens on /dev/log (a container, a
 * chroot, a machine without a syslog daemon), lines go to stderr instead:
 * never nowhere.  Style: one line per event, key=<value> pairs, e.g.
 *   log_error("cyrusdb: open failed file=<%s> error=<%s>", fname, msg);
 * Never log message bodies.  Library code logs and returns an error; only
 * main() exits (log_fatal).
 *
 * Every line is escaped as a whole before it is written (see log_escape):
 * it holds printable ASCII only, so any %s may carry client bytes (user,
 * mailbox and command names, addresses, SASL errors) without forging or
 * breaking a line.  Lines longer than 2047 bytes before escaping are cut.
 *
 * Under systemd: when stderr is journald's stream (JOURNAL_STREAM names
 * the device and inode of fd 2, see systemd.exec(5)), each stderr line
 * starts with its syslog priority as sd-daemon(3) prefixes do ("<3>" for
 * errors, "<4>" warnings, "<6>" info, "<7>" debug, "<2>" fatal), so that
 * journald keeps the level; the rest of the line is as elsewhere
 * ("prog[pid]: level: text", no time stamp: the journal adds its own).
 * Without JOURNAL_STREAM, or with stderr sent elsewhere, lines are
 * unchanged.  Syslog and log_file targets are never prefixed.
 */
#ifndef LIB_LOG_H
#define LIB_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum log_target {
    LOG_TO_STDERR = 0,   /* the default before log_init() */
    LOG_TO_SYSLOG = 1,
    LOG_TO_NONE = 2,     /* tests that provoke errors on purpose */
    LOG_TO_FILE = 3      /* set by log_set_file() */
};

/* The workers' rule for where their lines go: LOG_TO_STDERR when
 * descriptor 2 leads somewhere (master -l, a terminal, a file),
 * LOG_TO_SYSLOG when it is closed or /dev/null. */
enum log_target log_worker_target(void);

/* Set the program name shown in each line and where lines go.
 * LOG_TO_SYSLOG first checks that /dev/log accepts a connection; when it
 * does not, the target is LOG_TO_STDERR (log_syslog_missing() then
 * returns 1). */
void log_init(const char *progname, enum log_target target);

/* Log to the file at path from now on (opened O_APPEND, created 0640,
 * close-on-exec; each line "YYYY-MM-DD HH:MM:SS +ZZZZ prog[pid]: level:
 * text" written with one write(2), so that the lines of many processes
 * appending to one file do not mix).  Returns 0, or -1 with errno set
 * (the target is then unchanged). */
int log_set_file(const char *path);

/* The target in use (after the syslog check and log_set_file()).
 * Library code that probes quietly (log_init(NULL, LOG_TO_NONE)) puts the
 * target back with log_init(NULL, saved). */
enum log_target log_get_target(void);

/* imapd.conf's syslog_prefix, as Cyrus uses it: lines are tagged
 * "PREFIX/PROGRAM" from now on (syslog ident, stderr and file lines).
 * NULL or "" leaves the plain program name.  A prefix longer than 64
 * bytes is cut. */
void log_set_prefix(const char *prefix);

/* 1 when stderr lines carry "<N>" priority prefixes for journald
 * (decided by log_init(), or at the first line without it). */
int log_to_journal(void);

/* 1 when log_init() was asked for syslog and fell back to stderr. */
int log_syslog_missing(void);

/* While on, warnings, errors and fatal lines also go to stderr when the
 * target is syslog or a file: for a daemon's start, whose errors the
 * admin starting it must see. */
void log_set_echo(int on);

/* Log at the given severity.  Format strings are checked by the compiler. */
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Hold this process's lines (stderr and file targets; syslog is not
 * held) from log_hold() until log_release(), which writes them with one
 * write(2): the lines of one event (lmtpd: every recipient's and the
 * delivery's of one message) cost one system call, and reach the log
 * together, whole.  At most 16 KiB are held (more goes out at once, in
 * order); a child forked meanwhile writes its own lines at once;
 * log_fatal() releases first.  Lines held when the process is killed
 * are lost: hold only across work that ends in a reply. */
void log_hold(void);
void log_release(void);

/* Log and exit(code).  For main() and the master only. */
void log_fatal(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Enable or disable log_debug output (off by default). */
void log_set_debug(int on);

/* Enable or disable log_info output (on by default).  Interactive tools
 * turn it off so that their own output is not drowned in event lines;
 * warnings and errors are always shown. */
void log_set_info(int on);

/* Copy at most outlen-1 bytes of (s, len) into out, replacing control and
 * non-ASCII bytes with '?', and NUL-terminate.  Returns out.  For text
 * that goes elsewhere too (error strings, replies) and for (pointer,
 * length) data; log lines need it no more for safety, the emitter escapes
 * every line (log_escape). */
char *log_sanitize(const char *s, size_t len, char *out, size_t outlen);

/* What the emitter does to each line: (s, len) into out with printable
 * ASCII kept, CR, LF and TAB written as \r, \n, \t and every other byte
 * below 0x20 or above 0x7e as \xNN (a NUL too); backslash is kept.  Stops
 * before an escape that would not fit: out (outlen >= 1) is always
 * NUL-terminated.  Returns the length written.  outlen >= 4 * len + 1
 * never cuts. */
size_t log_escape(const char *s, size_t len, char *out, size_t outlen);

/* What the emitter formats a line with: fmt_vsnprintf() (lib/fmt.h),
 * returning the length written (at most outlen - 1, NUL-terminated; a
 * NUL from %c kept and counted) rather than the length wanted. */
size_t log_vformat(char *out, size_t outlen, const char *fmt, va_list ap);

#endif

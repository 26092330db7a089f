/*
 * log.c - logging to syslog, stderr or a file.  No allocation, so it is
 * safe to call on out-of-memory paths.
 *
 * Every line is formatted into a fixed buffer and then escaped as a whole
 * (log_escape) before it goes anywhere: CR, LF, TAB as \r \n \t, every
 * other control byte, DEL and 8-bit byte as \xNN.  A line therefore holds
 * printable ASCII only and ends where we end it, whatever a caller passes
 * in a %s: client bytes (addresses, user and mailbox names, SASL errors
 * that echo what the client sent) can neither forge a line nor smuggle
 * terminal controls into a log reader.  Backslashes are left alone (the
 * escaped form of a byte can be imitated by a client; a line cannot).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "lib/fmt.h"
#include "lib/log.h"
#include "lib/procid.h"

#define LOG_LINE_MAX 2048                 /* formatted, before escaping */
#define LOG_SAFE_MAX (LOG_LINE_MAX * 4)   /* every byte may become \xNN */

static const char *log_progname = "cyrusdeliver";
static enum log_target log_where = LOG_TO_STDERR;
static int log_debug_on;
static int log_info_off;
static int log_file_fd = -1;
static int log_no_syslog;
static int log_echo;
static int log_journal = -1;      /* stderr is journald's stream; -1: ask */

/* 1 when stderr is the stream journald gave us: JOURNAL_STREAM holds
 * "DEVICE:INODE" of that stream, and it is what fd 2 is now (a child
 * whose stderr was redirected elsewhere inherits the variable but not
 * the stream: no prefixes there). */
static int log_journal_check(void)
{
    const char *v = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    char extra;

    if (!v || sscanf(v, "%llu:%llu%c", &dev, &ino, &extra) != 2)
        return 0;
    if (fstat(STDERR_FILENO, &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

int log_to_journal(void)
{
    if (log_journal < 0)
        log_journal = log_journal_check();
    return log_journal;
}

/* Lines held by log_hold() (stderr and file targets): one buffer, the
 * descriptor its lines go to, and the process that holds (a child
 * forked meanwhile writes its own lines at once). */
static char log_held[16384];
static size_t log_heldlen;
static int log_held_fd = -1;
static pid_t log_holder;

static void log_write_all(int fd, const char *p, size_t n)
{
    size_t off;
    ssize_t w;

    for (off = 0; off < n; off += (size_t)w) {
        w = write(fd, p + off, n - off);
        if (w < 0 && errno == EINTR)
            w = 0;
        else if (w <= 0)
            return;
    }
}

static void log_held_flush(void)
{
    if (log_heldlen)
        log_write_all(log_held_fd, log_held, log_heldlen);
    log_heldlen = 0;
}

/* One whole line (with its newline) to fd: held while log_hold() is on
 * in this process, else written at once. */
static void log_out(int fd, const char *line, size_t n)
{
    if (log_holder && log_holder == procid_get()) {
        if (fd != log_held_fd || log_heldlen + n > sizeof(log_held))
            log_held_flush();
        log_held_fd = fd;
        if (n <= sizeof(log_held)) {
            memcpy(log_held + log_heldlen, line, n);
            log_heldlen += n;
            return;
        }
    }
    log_write_all(fd, line, n);
}

static void log_release_at_exit(void)
{
    log_release();
}

void log_hold(void)
{
    static int registered;

    if (!registered && atexit(log_release_at_exit) == 0)
        registered = 1;   /* an exit() while holding still writes them */
    log_holder = procid_get();
}

void log_release(void)
{
    if (log_holder && log_holder == procid_get())
        log_held_flush();
    log_holder = 0;
    log_heldlen = 0;
}

/* One line to stderr: "prog[pid]: level: text", with the sd-daemon(3)
 * priority prefix "<N>" first when stderr is journald's stream. */
static size_t log_put(char *out, size_t n, size_t outlen, const char *s)
{
    size_t len = strlen(s);

    if (len > outlen - 1 - n)
        len = outlen - 1 - n;
    memcpy(out + n, s, len);
    return n + len;
}

/* Put together by hand and written with one write(2): stdio's formatting
 * of the (long) text cost more than making it. */
static void log_stderr_write(int prio, const char *level, const char *text,
                             int withpid)
{
    char out[LOG_SAFE_MAX + 128], num[24];
    size_t n = 0;

    if (log_to_journal()) {
        snprintf(num, sizeof(num), "<%d>", prio & 7);
        n = log_put(out, n, sizeof(out), num);
    }
    n = log_put(out, n, sizeof(out), log_progname);
    if (withpid) {
        /* made again only when the process is another one (a fork) */
        static long pid_made = -1;
        static char pid_text[24];
        long pid = (long)procid_get();

        if (pid != pid_made) {
            snprintf(pid_text, sizeof(pid_text), "[%ld]", pid);
            pid_made = pid;
        }
        n = log_put(out, n, sizeof(out), pid_text);
    }
    n = log_put(out, n, sizeof(out), ": ");
    n = log_put(out, n, sizeof(out), level);
    n = log_put(out, n, sizeof(out), ": ");
    n = log_put(out, n, sizeof(out), text);
    out[n++] = '\n';   /* log_put() keeps a byte for it */
    log_out(STDERR_FILENO, out, n);
}

/* 1 when something accepts connections on /dev/log (datagram, as
 * syslog(3) tries first, else stream). */
static int log_syslog_reachable(void)
{
    static const int types[] = { SOCK_DGRAM, SOCK_STREAM };
    struct sockaddr_un sun;
    size_t i;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    strcpy(sun.sun_path, "/dev/log");
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        int fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
        int r;

        if (fd < 0)
            continue;
        r = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
        close(fd);
        if (r == 0)
            return 1;
    }
    return 0;
}

void log_init(const char *progname, enum log_target target)
{
    const char *slash;

    if (progname) {
        slash = strrchr(progname, '/');
        log_progname = slash ? slash + 1 : progname;
    }
    log_no_syslog = 0;
    log_journal = log_journal_check();
    if (target == LOG_TO_SYSLOG && !log_syslog_reachable()) {
        log_no_syslog = 1;
        target = LOG_TO_STDERR;
    }
    log_where = target;
    if (target == LOG_TO_SYSLOG)
        openlog(log_progname, LOG_PID | LOG_NDELAY, LOG_MAIL);
}

int log_set_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

    if (fd < 0)
        return -1;
    if (log_file_fd >= 0)
        close(log_file_fd);
    if (log_where == LOG_TO_SYSLOG)
        closelog();
    log_file_fd = fd;
    log_where = LOG_TO_FILE;
    return 0;
}

void log_set_prefix(const char *prefix)
{
    static char ident[64 + 1 + 64 + 1];
    char base[64 + 1];
    const char *slash = strrchr(log_progname, '/');

    /* the program name without a prefix set before (ident may be both) */
    snprintf(base, sizeof(base), "%s", slash ? slash + 1 : log_progname);
    if (prefix && *prefix)
        snprintf(ident, sizeof(ident), "%.64s/%.64s", prefix, base);
    else
        snprintf(ident, sizeof(ident), "%.64s", base);
    log_progname = ident;
    if (log_where == LOG_TO_SYSLOG) {
        closelog();
        openlog(log_progname, LOG_PID | LOG_NDELAY, LOG_MAIL);
    }
}

enum log_target log_get_target(void)
{
    return log_where;
}

int log_syslog_missing(void)
{
    return log_no_syslog;
}

void log_set_echo(int on)
{
    log_echo = on;
}

/* One line to the log file, with one write(2). */
static void log_file_write(const char *level, const char *line)
{
    char out[LOG_SAFE_MAX + 128], stamp[40];
    struct tm tm;
    time_t now = time(NULL);
    int n;

    if (!localtime_r(&now, &tm) ||
        !strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S %z", &tm))
        snprintf(stamp, sizeof(stamp), "%ld", (long)now);
    n = snprintf(out, sizeof(out), "%s %s[%ld]: %s: %s\n", stamp,
                 log_progname, (long)procid_get(), level, line);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(out)) {
        n = sizeof(out) - 1;
        out[n - 1] = '\n';
    }
    log_out(log_file_fd, out, (size_t)n);
}

void log_set_debug(int on)
{
    log_debug_on = on;
}

void log_set_info(int on)
{
    log_info_off = !on;
}


size_t log_escape(const char *s, size_t len, char *out, size_t outlen)
{
    static const char hex[] = "0123456789abcdef";
    size_t i, n = 0;

    if (!outlen)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[4];
        size_t elen;

        if (c >= 0x20 && c < 0x7f) {
            /* the usual bytes: the run of them copied at once */
            size_t k = i + 1, room = outlen - 1 - n;

            while (k < len && (unsigned char)s[k] >= 0x20 &&
                   (unsigned char)s[k] < 0x7f)
                k++;
            if (k - i > room)
                k = i + room;
            memcpy(out + n, s + i, k - i);
            n += k - i;
            i = k - 1;
            if (n + 1 >= outlen)
                break;
            continue;
        } else if (c == '\r' || c == '\n' || c == '\t') {
            e[0] = '\\';
            e[1] = c == '\r' ? 'r' : c == '\n' ? 'n' : 't';
            elen = 2;
        } else {
            e[0] = '\\';
            e[1] = 'x';
            e[2] = hex[c >> 4];
            e[3] = hex[c & 0xf];
            elen = 4;
        }
        if (n + elen >= outlen)
            break;              /* never half an escape */
        memcpy(out + n, e, elen);
        n += elen;
    }
    out[n] = '\0';
    return n;
}

size_t log_vformat(char *out, size_t outlen, const char *fmt, va_list ap)
{
    int r;

    if (!outlen)
        return 0;
    r = fmt_vsnprintf(out, outlen, fmt, ap);
    if (r < 0) {
        out[0] = '\0';
        return 0;
    }
    return (size_t)r < outlen ? (size_t)r : outlen - 1;
}

/* fmt formatted (at most LOG_LINE_MAX - 1 bytes) and escaped into safe. */
static void log_format(char *safe, size_t safelen, const char *fmt,
                       va_list ap)
{
    char line[LOG_LINE_MAX];
    /* a NUL from %c is escaped, not an end */
    size_t len = log_vformat(line, sizeof(line), fmt, ap);

    log_escape(line, len, safe, safelen);
}

static void log_vemit(int prio, const char *level, const char *fmt, va_list ap)
{
    char safe[LOG_SAFE_MAX];

    log_format(safe, sizeof(safe), fmt, ap);
    switch (log_where) {
    case LOG_TO_SYSLOG:
        syslog(prio, "%s", safe);
        break;
    case LOG_TO_STDERR:
        log_stderr_write(prio, level, safe, 1);
        break;
    case LOG_TO_FILE:
        log_file_write(level, safe);
        break;
    case LOG_TO_NONE:
        break;
    }
    if (log_echo && prio <= LOG_WARNING &&
        (log_where == LOG_TO_SYSLOG || log_where == LOG_TO_FILE))
        log_stderr_write(prio, level, safe, 0);
}

#define LOG_FUNCTION(fname, prio, level)        \
    void fname(const char *fmt, ...)            \
    {                                           \
        va_list ap;                             \
        va_start(ap, fmt);                      \
        log_vemit(prio, level, fmt, ap);        \
        va_end(ap);                             \
    }

void log_info(const char *fmt, ...)
{
    va_list ap;

    if (log_info_off)
        return;
    va_start(ap, fmt);
    log_vemit(LOG_INFO, "info", fmt, ap);
    va_end(ap);
}

LOG_FUNCTION(log_warning, LOG_WARNING, "warning")
LOG_FUNCTION(log_error, LOG_ERR, "error")

void log_debug(const char *fmt, ...)
{
    va_list ap;

    if (!log_debug_on)
        return;
    va_start(ap, fmt);
    log_vemit(LOG_DEBUG, "debug", fmt, ap);
    va_end(ap);
}

void log_fatal(int code, const char *fmt, ...)
{
    va_list ap;

    log_release();   /* what was held goes out before the end */
    va_start(ap, fmt);
    log_vemit(LOG_CRIT, "fatal", fmt, ap);
    va_end(ap);
    /* a fatal error must be seen even when logging goes nowhere */
    if (log_where == LOG_TO_NONE) {
        char safe[LOG_SAFE_MAX];

        va_start(ap, fmt);
        log_format(safe, sizeof(safe), fmt, ap);
        va_end(ap);
        log_stderr_write(LOG_CRIT, "fatal", safe, 0);
    }
    exit(code);
}

char *log_sanitize(const char *s, size_t len, char *out, size_t outlen)
{
    size_t i, n;

    if (!outlen)
        return out;
    n = len < outlen - 1 ? len : outlen - 1;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[n] = '\0';
    return out;
}

enum log_target log_worker_target(void)
{
    struct stat st, nul;

    if (fstat(2, &st) != 0)
        return LOG_TO_SYSLOG;
    if (S_ISCHR(st.st_mode) && stat("/dev/null", &nul) == 0 &&
        st.st_rdev == nul.st_rdev)
        return LOG_TO_SYSLOG;
    return LOG_TO_STDERR;
}

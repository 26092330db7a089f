/*
 * log.c - logging to syslog or stderr.  No allocation, so it is safe to call
 * on out-of-memory paths.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "lib/log.h"

static const char *log_progname = "cyrusdeliver";
static enum log_target log_where = LOG_TO_STDERR;
static int log_debug_on;
static int log_info_off;

void log_init(const char *progname, enum log_target target)
{
    const char *slash;

    if (progname) {
        slash = strrchr(progname, '/');
        log_progname = slash ? slash + 1 : progname;
    }
    log_where = target;
    if (target == LOG_TO_SYSLOG)
        openlog(log_progname, LOG_PID | LOG_NDELAY, LOG_MAIL);
}

enum log_target log_get_target(void)
{
    return log_where;
}

void log_set_debug(int on)
{
    log_debug_on = on;
}

void log_set_info(int on)
{
    log_info_off = !on;
}

static void log_vemit(int prio, const char *level, const char *fmt, va_list ap)
{
    char line[2048];

    vsnprintf(line, sizeof(line), fmt, ap);
    switch (log_where) {
    case LOG_TO_SYSLOG:
        syslog(prio, "%s", line);
        break;
    case LOG_TO_STDERR:
        fprintf(stderr, "%s[%ld]: %s: %s\n", log_progname, (long)getpid(),
                level, line);
        break;
    case LOG_TO_NONE:
        break;
    }
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

    va_start(ap, fmt);
    log_vemit(LOG_CRIT, "fatal", fmt, ap);
    va_end(ap);
    /* a fatal error must be seen even when logging goes nowhere */
    if (log_where == LOG_TO_NONE) {
        va_start(ap, fmt);
        fprintf(stderr, "%s: fatal: ", log_progname);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
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

/*
 * masterstatus.c - print the master's status file as a table.
 *
 *   masterstatus [-C imapd.conf] [-s statusfile]
 *
 * Which file: -s names it.  Otherwise the running master that reads the
 * same imapd.conf (the same file, compared by device and inode) is looked
 * for in /proc, and its status file taken: its own -s, else
 * CONFIGDIRECTORY/master.status, relative names resolved against that
 * master's working directory.  When no such master is found:
 * CONFIGDIRECTORY/master.status.
 *
 * The file (format in master/master_status.h) is read once, bounded to
 * 4 MiB; every line is parsed as "KIND NAME key=value ...", unknown keys
 * are ignored.  Times are printed as local ISO 8601 with their age
 * ("2024-05-01 10:00:00 +0200, 12s ago"), durations as "3m05s".  Exit 0
 * after printing; 1 with a message when the file is missing, unreadable,
 * or older than 10 s ("master not running?").
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"

#define MS_DEFAULT_CONFIG IMAPCONF_DEFAULT_PATH
#define MS_MAX_SIZE (4u << 20)
#define MS_STALE_SECS 10

/* The value of KEY= in the line (ptr,len), copied into out. */
static const char *field(const char *line, size_t len, const char *key,
                         char *out, size_t outlen)
{
    size_t kl = strlen(key), i = 0;

    while (i < len) {
        size_t start = i, end;
        while (i < len && line[i] != ' ') i++;
        end = i;
        if (end - start > kl && memcmp(line + start, key, kl) == 0
            && line[start + kl] == '=') {
            size_t vl = end - start - kl - 1;
            if (vl >= outlen) vl = outlen - 1;
            memcpy(out, line + start + kl + 1, vl);
            out[vl] = '\0';
            return out;
        }
        while (i < len && line[i] == ' ') i++;
    }
    snprintf(out, outlen, "-");
    return out;
}

/* Word number n (0-based) of the line. */
static const char *word(const char *line, size_t len, int n, char *out,
                        size_t outlen)
{
    size_t i = 0;

    for (;;) {
        size_t start, wl;
        while (i < len && line[i] == ' ') i++;
        start = i;
        while (i < len && line[i] != ' ') i++;
        if (start == i) break;
        if (n-- == 0) {
            wl = i - start;
            if (wl >= outlen) wl = outlen - 1;
            memcpy(out, line + start, wl);
            out[wl] = '\0';
            return out;
        }
    }
    snprintf(out, outlen, "-");
    return out;
}

/* A duration in seconds as "12s", "3m05s", "2h01m", "4d03h". */
static const char *ms_duration(long secs, char *out, size_t outlen)
{
    if (secs < 0)
        secs = 0;
    if (secs < 60)
        snprintf(out, outlen, "%lds", secs);
    else if (secs < 3600)
        snprintf(out, outlen, "%ldm%02lds", secs / 60, secs % 60);
    else if (secs < 86400)
        snprintf(out, outlen, "%ldh%02ldm", secs / 3600, secs / 60 % 60);
    else
        snprintf(out, outlen, "%ldd%02ldh", secs / 86400, secs / 3600 % 24);
    return out;
}

/* An epoch time (decimal text) as "YYYY-MM-DD HH:MM:SS +ZZZZ, AGE ago"
 * (or "in AGE" for a time to come); the text itself when it is not a
 * number. */
static const char *ms_when(const char *epoch, time_t now, char *out,
                           size_t outlen)
{
    char *end, stamp[64], d[32];
    long v;
    time_t t;
    struct tm tm;

    errno = 0;
    v = strtol(epoch, &end, 10);
    if (errno || end == epoch || *end || v <= 0) {
        snprintf(out, outlen, "%s", epoch);
        return out;
    }
    t = (time_t)v;
    if (!localtime_r(&t, &tm) ||
        !strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S %z", &tm)) {
        snprintf(out, outlen, "%s", epoch);
        return out;
    }
    if (t <= now)
        snprintf(out, outlen, "%s, %s ago", stamp,
                 ms_duration((long)(now - t), d, sizeof(d)));
    else
        snprintf(out, outlen, "%s, in %s", stamp,
                 ms_duration((long)(t - now), d, sizeof(d)));
    return out;
}

/* path made absolute against dir (when relative) into out. */
static void ms_resolve(const char *dir, const char *path, struct buf *out)
{
    buf_reset(out);
    if (path[0] == '/' || !dir)
        buf_appendcstr(out, path);
    else
        buf_printf(out, "%s/%s", dir, path);
}

/*
 * Look for a running master that reads the configuration file `conf`
 * (same device and inode).  On success, its status file goes into out:
 * its -s argument, else configdir/master.status; relative names are
 * resolved against the master's working directory (its start directory
 * with -D; "/" once it has daemonized).  Returns the master's pid, or 0
 * when none was found.
 */
static long ms_find_master(const struct stat *conf, const char *configdir,
                           struct buf *out)
{
    DIR *proc = opendir("/proc");
    struct dirent *de;
    long found = 0;

    if (!proc)
        return 0;
    while (!found && (de = readdir(proc)) != NULL) {
        char path[300], cwd[PATH_MAX], *args = NULL;
        const char *copt = IMAPCONF_DEFAULT_PATH, *sopt = NULL, *a0, *base;
        struct buf b = BUF_INITIALIZER, p = BUF_INITIALIZER;
        char chunk[4096];
        struct stat st;
        ssize_t n;
        size_t i;
        FILE *f;

        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        while ((n = (ssize_t)fread(chunk, 1, sizeof(chunk), f)) > 0 &&
               b.len < 65536)
            buf_append(&b, chunk, (size_t)n);
        fclose(f);
        if (!b.len) {
            buf_free(&b);
            continue;
        }
        args = b.s;
        a0 = args;
        base = strrchr(a0, '/') ? strrchr(a0, '/') + 1 : a0;
        if (strcmp(base, "master") != 0) {
            buf_free(&b);
            continue;
        }
        /* walk the arguments: -C FILE, -s FILE (also -CFILE, -sFILE) */
        for (i = strlen(a0) + 1; i < b.len; ) {
            const char *arg = args + i;
            size_t alen = strlen(arg);
            const char *next = i + alen + 1 < b.len ? arg + alen + 1 : NULL;

            if ((arg[0] == '-' && (arg[1] == 'C' || arg[1] == 's'))) {
                const char *val = arg[2] ? arg + 2 : next;
                if (val && arg[1] == 'C')
                    copt = val;
                else if (val)
                    sopt = val;
                if (!arg[2] && next)
                    i += strlen(next) + 1;
            }
            i += alen + 1;
        }
        snprintf(path, sizeof(path), "/proc/%s/cwd", de->d_name);
        n = readlink(path, cwd, sizeof(cwd) - 1);
        if (n > 0)
            cwd[n] = '\0';
        ms_resolve(n > 0 ? cwd : NULL, copt, &p);
        if (stat(buf_cstring(&p), &st) == 0 && st.st_dev == conf->st_dev &&
            st.st_ino == conf->st_ino) {
            if (sopt) {
                ms_resolve(n > 0 ? cwd : NULL, sopt, out);
            } else {
                ms_resolve(n > 0 ? cwd : NULL, configdir, &p);
                buf_reset(out);
                buf_printf(out, "%s/master.status", buf_cstring(&p));
            }
            found = atol(de->d_name);
        }
        buf_free(&p);
        buf_free(&b);
    }
    closedir(proc);
    return found;
}

static void ms_usage(FILE *out)
{
    fprintf(out,
"Usage: masterstatus [-C imapd.conf] [-s statusfile]\n"
"\n"
"Show the services, children and events of the running master, from its\n"
"status file.\n"
"  -C FILE   the imapd.conf the master was started with (default "
MS_DEFAULT_CONFIG ");\n"
"            the status file is the one of the running master that reads\n"
"            this file (its -s, else CONFIGDIRECTORY/master.status)\n"
"  -s FILE   read this status file instead\n"
"  -h, --help  this text\n"
"Exit status: 0 shown; 1 no status file, or not updated for more than\n"
"%d seconds (master not running?); 2 usage error.\n", MS_STALE_SECS);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    time_t now = time(NULL);
    const char *conffile = MS_DEFAULT_CONFIG, *statusfile = NULL;
    struct buf path = BUF_INITIALIZER, data = BUF_INITIALIZER;
    struct imapconf *ic = NULL;
    char *err = NULL;
    FILE *f;
    struct stat sb;
    char chunk[8192];
    size_t n, pos;
    int opt, pass;
    long updated = 0;

    log_init("masterstatus", LOG_TO_STDERR);
    while ((opt = getopt_long(argc, argv, "C:s:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': conffile = optarg; break;
        case 's': statusfile = optarg; break;
        case 'h': ms_usage(stdout); return 0;
        default:
            ms_usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        ms_usage(stderr);
        return 2;
    }
    if (!statusfile) {
        struct stat cst;
        const char *cd;

        if (imapconf_load(conffile, &ic, &err) < 0) {
            fprintf(stderr, "masterstatus: %s\n", err ? err : conffile);
            free(err);
            return 1;
        }
        cd = imapconf_getstring(ic, "configdirectory");
        if (!cd || !*cd)
            cd = ".";
        if (stat(conffile, &cst) < 0 ||
            !ms_find_master(&cst, cd, &path)) {
            buf_reset(&path);
            buf_printf(&path, "%s/master.status", cd);
        }
        statusfile = buf_cstring(&path);
    }

    f = fopen(statusfile, "r");
    if (!f || fstat(fileno(f), &sb) < 0) {
        fprintf(stderr, "masterstatus: cannot read %s: %s (master not "
                "running?)\n", statusfile, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    buf_set_max(&data, MS_MAX_SIZE);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (buf_append(&data, chunk, n) < 0) {
            fprintf(stderr, "masterstatus: %s is too large\n", statusfile);
            fclose(f);
            return 1;
        }
    }
    fclose(f);

    /* pass 0: master line; 1: services; 2: children; 3: events */
    for (pass = 0; pass < 4; pass++) {
        static const char *kinds[] = { "master", "service", "child",
                                       "event" };
        int header = 0;

        for (pos = 0; pos < data.len; ) {
            const char *line = data.s + pos;
            const char *nl = memchr(line, '\n', data.len - pos);
            size_t len = nl ? (size_t)(nl - line) : data.len - pos;
            char k[16], a[64], b[64], c[64], d[64], e[64], g[64], h[64];
            char l[512];

            pos += len + (nl ? 1 : 0);
            word(line, len, 0, k, sizeof(k));
            if (strcmp(k, kinds[pass]) != 0) continue;
            if (pass == 0) {
                updated = atol(field(line, len, "updated", a, sizeof(a)));
                printf("status file %s\n", statusfile);
                printf("master pid %s\n  started %s\n",
                       field(line, len, "pid", b, sizeof(b)),
                       ms_when(field(line, len, "started", c, sizeof(c)), now,
                               l, sizeof(l)));
                printf("  updated %s\n", ms_when(a, now, l, sizeof(l)));
                continue;
            }
            if (!header) {
                if (pass == 1)
                    printf("\n%-16s %6s %6s %6s %8s %8s %7s  %s\n",
                           "SERVICE", "READY", "BUSY", "TOTAL", "SERVED",
                           "MAXCHILD", "BACKOFF", "LISTEN");
                else if (pass == 2)
                    printf("\n%-16s %8s %-9s %8s %8s\n", "CHILD", "PID",
                           "STATE", "SERVED", "AGE");
                else
                    printf("\n%-16s %8s %-9s %s\n", "EVENT", "PID", "STATE",
                           "NEXT");
                header = 1;
            }
            word(line, len, 1, a, sizeof(a));
            if (pass == 1)
                printf("%-16s %6s %6s %6s %8s %8s %7s  %s\n", a,
                       field(line, len, "ready", b, sizeof(b)),
                       field(line, len, "busy", c, sizeof(c)),
                       field(line, len, "total", d, sizeof(d)),
                       field(line, len, "served", e, sizeof(e)),
                       field(line, len, "maxchild", g, sizeof(g)),
                       field(line, len, "backoff", h, sizeof(h)),
                       field(line, len, "listen", l, sizeof(l)));
            else if (pass == 2)
                printf("%-16s %8s %-9s %8s %8s\n", a,
                       field(line, len, "pid", b, sizeof(b)),
                       field(line, len, "state", c, sizeof(c)),
                       field(line, len, "served", d, sizeof(d)),
                       ms_duration(atol(field(line, len, "age", e, sizeof(e))),
                                   g, sizeof(g)));
            else
                printf("%-16s %8s %-9s %s\n", a,
                       field(line, len, "pid", b, sizeof(b)),
                       field(line, len, "state", c, sizeof(c)),
                       ms_when(field(line, len, "next", d, sizeof(d)), now,
                               l, sizeof(l)));
        }
    }
    buf_free(&data);
    buf_free(&path);
    imapconf_free(&ic);

    if (updated == 0 || time(NULL) - updated > MS_STALE_SECS
        || time(NULL) - sb.st_mtime > MS_STALE_SECS) {
        fprintf(stderr, "masterstatus: %s is stale (updated %ld s ago): "
                "master not running?\n", statusfile,
                (long)(time(NULL) - (updated ? updated : sb.st_mtime)));
        return 1;
    }
    return 0;
}

/*
 * master_compat.c - Cyrus's cyrus.conf commands mapped to our programs
 * (the table and the rules are in master_compat.h).
 *
 * Invariants: an entry is either left exactly as written, rewritten to a
 * command of one of our programs that always carries "-C IMAPDCONF", or
 * removed; every rewrite is logged once (info) and every removal once
 * (warning).  Nothing here runs a program; the only file-system access is
 * stat() of candidate program paths.
 */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "master/master_compat.h"
#include "master/master_service.h"

enum compat_kind {
    COMPAT_NONE,            /* Cyrus's, with no equivalent here */
    COMPAT_IMAPD,
    COMPAT_LMTPD,
    COMPAT_TIMSIEVED,
    COMPAT_CTL_CYRUSDB,
    COMPAT_CTL_DELIVER,
    COMPAT_EXPIRE
};

struct compat_program {
    const char *name;
    enum compat_kind kind;
    const char *spec;       /* Cyrus's getopt letters (':' = argument) */
};

static const struct compat_program compat_programs[] = {
    { .name = "imapd", .kind = COMPAT_IMAPD, .spec = "C:U:T:p:sDN" },
    { .name = "lmtpd", .kind = COMPAT_LMTPD, .spec = "C:U:T:aD" },
    { .name = "timsieved", .kind = COMPAT_TIMSIEVED, .spec = "C:U:T:D" },
    { .name = "ctl_cyrusdb", .kind = COMPAT_CTL_CYRUSDB, .spec = "C:rcx" },
    { .name = "ctl_deliver", .kind = COMPAT_CTL_DELIVER, .spec = "C:dE:f:" },
    { .name = "cyr_expire", .kind = COMPAT_EXPIRE,
      .spec = "C:A:D:E:X:p:u:vaxthc" },
    /* Cyrus's servers and tools with no equivalent here */
    { .name = "pop3d" }, { .name = "nntpd" }, { .name = "httpd" },
    { .name = "notifyd" }, { .name = "mupdate" },
    { .name = "proxyd" }, { .name = "lmtpproxyd" },
    { .name = "pop3proxyd" }, { .name = "fud" }, { .name = "idled" },
    { .name = "smmapd" }, { .name = "backupd" }, { .name = "sync_server" },
    { .name = "sync_client" }, { .name = "calalarmd" },
    { .name = "ptloader" }, { .name = "tls_prune" }, { .name = "squatter" },
    { .name = "ctl_mboxlist" }, { .name = "ctl_conversationsdb" },
    { .name = "ctl_backups" }, { .name = "ctl_zoneinfo" },
    { .name = "cyr_synclog" }, { .name = "cyr_deny" }, { .name = "cyr_df" },
    { .name = "cyr_info" }, { .name = "cyr_buildinfo" },
    { .name = "cyr_userseen" }, { .name = "cyr_virusscan" },
    { .name = "cyr_backup" }, { .name = "cyr_ls" }, { .name = "cyr_pwd" },
    { .name = "arbitron" }, { .name = "arbitronsort" },
    { .name = "chk_cyrus" }, { .name = "cyrdump" }, { .name = "deliver" },
    { .name = "ipurge" }, { .name = "mbexamine" }, { .name = "mbpath" },
    { .name = "ptexpire" }, { .name = "ptdump" }, { .name = "quota" },
    { .name = "reconstruct" }, { .name = "relocate_by_id" },
    { .name = "restore" }, { .name = "sievec" }, { .name = "sieved" },
    { .name = "unexpunge" }, { .name = "upgrade-db" },
    { .name = "makedirs" }, { .name = "cvt_xlist_specialuse" },
};

#define COMPAT_NPROGRAMS (sizeof(compat_programs) / sizeof(compat_programs[0]))

static const char *const compat_cyrus_dirs[] = {
    "/usr/lib/cyrus/bin", "/usr/libexec/cyrus-imapd", "/usr/lib/cyrus-imapd",
    "/usr/cyrus/bin", "/usr/local/cyrus/bin",
};

/* where our programs are looked for */
static const char *compat_servicedir, *compat_masterdir;

static const char *const section_names[] = {
    "START", "SERVICES", "EVENTS", "DAEMON"
};

static const struct compat_program *compat_find(const char *name)
{
    size_t i;

    for (i = 0; i < COMPAT_NPROGRAMS; i++)
        if (strcmp(compat_programs[i].name, name) == 0)
            return &compat_programs[i];
    return NULL;
}

static const char *compat_basename(const char *path)
{
    const char *s = strrchr(path, '/');

    return s ? s + 1 : path;
}

static int compat_executable(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode)
        && access(path, X_OK) == 0;
}

/* b's path when it is an executable file: canonical, malloc'ed. */
static char *compat_found(struct buf *b)
{
    char *r = NULL;

    if (compat_executable(buf_cstring(b))) {
        r = realpath(buf_cstring(b), NULL);
        if (!r) r = buf_release(b);
    }
    buf_free(b);
    return r;
}

/* Our program `name`: a malloc'ed path, or NULL. */
static char *compat_ours(const char *name)
{
    static const char *const siblings[] = { "lmtpd", "imapd", "metricsd",
                                            "timsieved", "tools" };
    struct buf b = BUF_INITIALIZER;
    char *r = NULL;
    size_t i;

    if (!*name || strchr(name, '/'))
        return NULL;
    if (compat_servicedir) {
        buf_printf(&b, "%s/%s", compat_servicedir, name);
        if ((r = compat_found(&b)) != NULL) return r;
    }
    if (compat_masterdir) {
        buf_printf(&b, "%s/%s", compat_masterdir, name);
        if ((r = compat_found(&b)) != NULL) return r;
        for (i = 0; i < sizeof(siblings) / sizeof(siblings[0]); i++) {
            buf_printf(&b, "%s/../%s/%s", compat_masterdir, siblings[i],
                       name);
            if ((r = compat_found(&b)) != NULL) return r;
        }
    }
#ifdef MASTER_LIBEXECDIR
    buf_printf(&b, "%s/%s", MASTER_LIBEXECDIR, name);
    if ((r = compat_found(&b)) != NULL) return r;
#endif
    return NULL;
}

char *master_compat_find_ours(const char *name)
{
    return name ? compat_ours(name) : NULL;
}

/* 1 when path is the same file as our program of that base name. */
static int compat_is_ours(const char *path)
{
    char *ours = compat_ours(compat_basename(path));
    struct stat a, b;
    int r;

    if (!ours) return 0;
    r = stat(path, &a) == 0 && stat(ours, &b) == 0
        && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    free(ours);
    return r;
}

static int compat_in_cyrus_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t len, i;

    if (!slash) return 0;
    len = (size_t)(slash - path);
    for (i = 0; i < sizeof(compat_cyrus_dirs) / sizeof(compat_cyrus_dirs[0]);
         i++) {
        if (strlen(compat_cyrus_dirs[i]) == len
            && memcmp(compat_cyrus_dirs[i], path, len) == 0)
            return 1;
    }
    return 0;
}

/* Cyrus's duration (NUMBER with an optional unit d/h/m/s, days when
 * none) in whole days, rounded up; -1 when malformed. */
static long compat_days(const char *s)
{
    unsigned long long v = 0;
    const char *p = s;
    long secs_per_unit = 86400;

    if (!*p) return -1;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (unsigned)(*p - '0');
        if (v > 1000000) return -1;
        p++;
    }
    if (p == s) return -1;
    if (*p) {
        switch (*p) {
        case 'd': secs_per_unit = 86400; break;
        case 'h': secs_per_unit = 3600; break;
        case 'm': secs_per_unit = 60; break;
        case 's': secs_per_unit = 1; break;
        default: return -1;
        }
        if (p[1]) return -1;
    }
    return (long)((v * (unsigned long long)secs_per_unit + 86399) / 86400);
}

static int compat_number(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

/* What one Cyrus command line asks for, after its options were read. */
struct compat_opts {
    int flag;                       /* imapd -s, lmtpd -a */
    int flag_r, flag_c;             /* ctl_cyrusdb -r, -c */
    const char *uses, *timeout;     /* -U, -T */
    const char *age_e, *age_x, *age_d;  /* -E, -X, -D (valid durations) */
    struct buf ignored;             /* dropped words, for the info line */
};

static void compat_ignore(struct compat_opts *o, char letter,
                          const char *arg)
{
    if (o->ignored.len) buf_putc(&o->ignored, ' ');
    if (letter) buf_printf(&o->ignored, "-%c", letter);
    if (letter && arg) buf_putc(&o->ignored, ' ');
    if (arg) buf_appendcstr(&o->ignored, arg);
}

/* Read the options of argv (after the program word) by prog's spec. */
static void compat_read_opts(const struct compat_program *prog,
                             char **argv, struct compat_opts *o)
{
    size_t i;

    for (i = 0; argv[i]; i++) {
        const char *w = argv[i];
        size_t j;

        if (strcmp(w, "--") == 0) {
            for (i++; argv[i]; i++) compat_ignore(o, 0, argv[i]);
            return;
        }
        if (w[0] != '-' || !w[1]) {
            compat_ignore(o, 0, w);
            continue;
        }
        for (j = 1; w[j]; j++) {
            char c = w[j];
            const char *sp = strchr(prog->spec, c);
            const char *arg = NULL;

            if (c != ':' && sp && sp[1] == ':') {
                if (w[j + 1]) arg = w + j + 1;
                else if (argv[i + 1]) arg = argv[++i];
                else arg = "";
            }
            switch (prog->kind) {
            case COMPAT_IMAPD:
            case COMPAT_LMTPD:
            case COMPAT_TIMSIEVED:
                if (prog->kind != COMPAT_TIMSIEVED
                    && c == (prog->kind == COMPAT_IMAPD ? 's' : 'a'))
                    o->flag = 1;
                else if ((c == 'U' || c == 'T') && arg
                         && compat_number(arg))
                    *(c == 'U' ? &o->uses : &o->timeout) = arg;
                else
                    compat_ignore(o, c, arg);
                break;
            case COMPAT_CTL_CYRUSDB:
                if (c == 'r' && !o->flag_c) o->flag_r = 1;
                else if (c == 'c' && !o->flag_r) o->flag_c = 1;
                else compat_ignore(o, c, arg);
                break;
            case COMPAT_CTL_DELIVER:
            case COMPAT_EXPIRE:
                if (c == 'E' && arg && compat_days(arg) >= 0)
                    o->age_e = arg;
                else if (c == 'X' && prog->kind == COMPAT_EXPIRE && arg
                         && compat_days(arg) >= 0)
                    o->age_x = arg;
                else if (c == 'D' && prog->kind == COMPAT_EXPIRE && arg
                         && compat_days(arg) >= 0)
                    o->age_d = arg;
                else
                    compat_ignore(o, c, arg);
                break;
            case COMPAT_NONE:
                break;
            }
            if (arg) break;     /* the rest of the word was the argument */
        }
    }
}

/* Append one word to b, quoted when it holds blanks.  -1 when it cannot
 * be written in cyrus.conf's syntax (a double quote). */
static int compat_put_word(struct buf *b, const char *w)
{
    if (strchr(w, '"')) return -1;
    if (b->len) buf_putc(b, ' ');
    if (!*w || strpbrk(w, " \t\r\n#\\"))
        buf_printf(b, "\"%s\"", w);
    else
        buf_appendcstr(b, w);
    return 0;
}

struct compat_result {
    struct buf cmd;         /* the new command; empty: leave alone */
    const char *why;        /* set: remove the entry, with this reason */
    char whybuf[160];
    struct buf ignored;
};

/* Our command for prog with options o into out (prefix words first).
 * Returns 0, or -1 with r->why set. */
static int compat_build(struct compat_result *r, char **prefix,
                        size_t nprefix, const char *ours_name,
                        const char *imapdconf, const char *const *args,
                        struct buf *out)
{
    char *ours = compat_ours(ours_name);
    size_t i;
    int bad = 0;

    if (!ours) {
        snprintf(r->whybuf, sizeof(r->whybuf), "our %s was not found "
                 "next to the master", ours_name);
        r->why = r->whybuf;
        return -1;
    }
    buf_reset(out);
    for (i = 0; i < nprefix; i++) bad |= compat_put_word(out, prefix[i]);
    bad |= compat_put_word(out, ours);
    bad |= compat_put_word(out, "-C");
    bad |= compat_put_word(out, imapdconf);
    for (i = 0; args[i]; i++) bad |= compat_put_word(out, args[i]);
    free(ours);
    if (bad) {
        r->why = "a path holds a double quote";
        return -1;
    }
    return 0;
}

/* Decide about one entry's command. */
static void compat_entry(const struct master_entry *e, const char *imapdconf,
                         struct compat_result *r)
{
    char **argv = master_conf_split_cmd(e->cmd);
    const struct compat_program *prog = NULL;
    const char *word, *tool = NULL;
    size_t k = 0, toolpos;
    int cyrus = 0;
    char *resolved;

    if (!argv || !argv[0]) goto done;   /* the loader never lets this by */

    /* look through "nice [-n N | -N]" */
    if (strcmp(compat_basename(argv[0]), "nice") == 0 && argv[1]) {
        k = 1;
        if (strcmp(argv[1], "-n") == 0 && argv[2]) k = 3;
        else if (argv[1][0] == '-') k = 2;
        if (!argv[k]) { k = 0; goto done; }
    }
    word = argv[k];
    toolpos = k;
    if (strcmp(compat_basename(word), "cyrus") == 0) {
        /* Debian's wrapper: cyrus TOOL ARGS */
        cyrus = 1;
        toolpos = k + 1;
        tool = argv[toolpos];
        if (!tool) {
            r->why = "the cyrus wrapper names no program";
            goto done;
        }
        prog = compat_find(tool);
        if (!prog) {
            struct buf alt = BUF_INITIALIZER;

            buf_printf(&alt, "cyr_%s", tool);
            prog = compat_find(buf_cstring(&alt));
            buf_reset(&alt);
            buf_printf(&alt, "ctl_%s", tool);
            if (!prog) prog = compat_find(buf_cstring(&alt));
            buf_free(&alt);
        }
    } else if (strchr(word, '/')) {
        tool = compat_basename(word);
        if (compat_is_ours(word)) goto done;
        if (compat_in_cyrus_dir(word)) {
            cyrus = 1;
            prog = compat_find(tool);
        } else if (compat_executable(word)) {
            goto done;                  /* some other program: as written */
        } else {
            prog = compat_find(tool);
            if (prog) {
                cyrus = 1;
            } else if (e->section != MASTER_SECTION_START) {
                r->why = "the program does not exist";
                goto done;
            } else {
                goto done;
            }
        }
    } else {
        tool = word;
        prog = compat_find(tool);
        if (prog && prog->kind != COMPAT_NONE) {
            cyrus = 1;
        } else if ((resolved = compat_ours(tool)) != NULL) {
            free(resolved);
            goto done;                  /* one of ours, by name */
        } else if (prog) {
            cyrus = 1;
        } else if ((resolved = master_service_resolve(tool)) != NULL) {
            free(resolved);
            goto done;                  /* some other program */
        } else if (e->section != MASTER_SECTION_START) {
            r->why = "the program was not found";
            goto done;
        } else {
            goto done;
        }
    }
    if (!cyrus) goto done;
    if (!prog || prog->kind == COMPAT_NONE) {
        snprintf(r->whybuf, sizeof(r->whybuf),
                 "Cyrus's %s has no equivalent here", tool);
        r->why = r->whybuf;
        goto done;
    }

    {
        struct compat_opts o;
        const char *args[8];
        size_t n = 0;
        int is_service = prog->kind == COMPAT_IMAPD
                         || prog->kind == COMPAT_LMTPD
                         || prog->kind == COMPAT_TIMSIEVED;

        if (is_service && e->section != MASTER_SECTION_SERVICES) {
            snprintf(r->whybuf, sizeof(r->whybuf), "%s is a service: it "
                     "belongs in SERVICES", prog->name);
            r->why = r->whybuf;
            goto done;
        }
        if (!is_service && (e->section == MASTER_SECTION_SERVICES
                            || e->section == MASTER_SECTION_DAEMON)) {
            snprintf(r->whybuf, sizeof(r->whybuf), "%s is a tool: it "
                     "belongs in START or EVENTS", prog->name);
            r->why = r->whybuf;
            goto done;
        }
        memset(&o, 0, sizeof(o));
        compat_read_opts(prog, argv + toolpos + 1, &o);
        buf_free(&r->ignored);
        r->ignored = o.ignored;

        switch (prog->kind) {
        case COMPAT_IMAPD:
        case COMPAT_LMTPD:
        case COMPAT_TIMSIEVED:
            if (o.flag) args[n++] = prog->kind == COMPAT_IMAPD ? "-s"
                                                                 : "-a";
            if (o.uses) { args[n++] = "-U"; args[n++] = o.uses; }
            if (o.timeout) { args[n++] = "-T"; args[n++] = o.timeout; }
            args[n] = NULL;
            compat_build(r, argv, k, prog->name, imapdconf, args, &r->cmd);
            break;
        case COMPAT_CTL_CYRUSDB:
            if (!o.flag_r && !o.flag_c) {
                r->why = "ctl_cyrusdb without -r or -c asks for nothing "
                         "we do";
                break;
            }
            args[n++] = o.flag_r ? "-r" : "-c";
            args[n] = NULL;
            compat_build(r, argv, k, "ctl_cyrusdb", imapdconf, args,
                         &r->cmd);
            break;
        case COMPAT_CTL_DELIVER:
        case COMPAT_EXPIRE:
            if (!o.age_e && !o.age_x && !o.age_d) {
                snprintf(r->whybuf, sizeof(r->whybuf), "%s without -E%s "
                         "asks for nothing we do", prog->name,
                         prog->kind == COMPAT_EXPIRE ? ", -X or -D" : "");
                r->why = r->whybuf;
                break;
            }
            if (o.age_e) { args[n++] = "-E"; args[n++] = o.age_e; }
            if (o.age_x) { args[n++] = "-X"; args[n++] = o.age_x; }
            if (o.age_d) { args[n++] = "-D"; args[n++] = o.age_d; }
            args[n] = NULL;
            compat_build(r, argv, k, "cyr_expire", imapdconf, args,
                         &r->cmd);
            break;
        case COMPAT_NONE:
            break;
        }
    }
done:
    master_conf_argv_free(argv);
}

size_t master_compat_apply(struct master_conf *conf, const char *confname,
                           const char *servicedir, const char *masterdir,
                           const char *imapdconf)
{
    size_t i, removed = 0;

    if (!conf) return 0;
    compat_servicedir = servicedir;
    compat_masterdir = masterdir;
    for (i = 0; i < conf->nentries; i++) {
        struct master_entry *e = &conf->entries[i];
        const char *sec = section_names[e->section];
        struct compat_result r;

        memset(&r, 0, sizeof(r));
        compat_entry(e, imapdconf, &r);
        if (r.why) {
            log_warning("%s:%lu: %s entry=<%s> cmd=<%s> %s: %s", confname,
                        e->line, sec, e->name, e->cmd,
                        e->section == MASTER_SECTION_SERVICES
                        ? "refused, no socket opened" : "skipped", r.why);
            master_conf_remove(conf, i);
            i--;                        /* wraps; the loop's i++ undoes it */
            removed++;
        } else if (r.cmd.len) {
            char *cmd = buf_release(&r.cmd);

            if (!cmd) log_fatal(71, "master: out of memory");
            log_info("%s:%lu: %s entry=<%s> cmd=<%s> runs=<%s>%s%s%s",
                     confname, e->line, sec, e->name, e->cmd, cmd,
                     r.ignored.len ? " ignored=<" : "",
                     r.ignored.len ? buf_cstring(&r.ignored) : "",
                     r.ignored.len ? ">" : "");
            free(e->cmd);
            e->cmd = cmd;
        }
        buf_free(&r.cmd);
        buf_free(&r.ignored);
    }
    /* the directories stay: master_compat_find_ours() serves the
     * master's exec of names added later (its own metricsd entry), and
     * the caller keeps them until it exits */
    return removed;
}

/*
 * mailbench_report.c - what mailbench measures and how it tells it:
 * latency samples (every one kept, sorted at the end: the percentiles are
 * exact, nearest rank), per-second series for the plot, the host's
 * counters from /proc (load average at the end; CPU shares from the
 * aggregate "cpu" line of /proc/stat and disk writes from /proc/diskstats
 * as deltas over the run, for whole devices of /sys/block other than
 * loop*, ram*, zram*, dm-*), the live progress line, and the outputs: the
 * table on stdout, --json, --csv and --plot (gnuplot, run on a script in a
 * temporary file; terminal pngcairo, else png).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/mailbench.h"

static const char *const mailbench_lat_names[MB_LAT_COUNT] = {
    [MB_LAT_CONNECT] = "CONNECT",
    [MB_LAT_LHLO] = "LHLO",
    [MB_LAT_MAIL] = "MAIL",
    [MB_LAT_RCPT] = "RCPT",
    [MB_LAT_DATA] = "DATA",
    [MB_LAT_DELIVERY] = "DELIVERY",
    [MB_LAT_IMAP_CONNECT] = "CONNECT",
    [MB_LAT_LOGIN] = "LOGIN",
    [MB_LAT_SELECT] = "SELECT",
    [MB_LAT_UIDS] = "UIDS",
    [MB_LAT_FETCH_HDR] = "FETCH-HDR",
    [MB_LAT_FETCH_BODY] = "FETCH-BODY",
    [MB_LAT_STORE] = "STORE",
    [MB_LAT_SEARCH] = "SEARCH",
    [MB_LAT_EXPUNGE] = "EXPUNGE",
    [MB_LAT_APPEND] = "APPEND",
    [MB_LAT_LOGOUT] = "LOGOUT",
};

static const char *const mailbench_err_names[MB_ERR_COUNT] = {
    [MB_ERR_CONNECT] = "connect",
    [MB_ERR_CLOSED] = "closed",
    [MB_ERR_TIMEOUT] = "timeout",
    [MB_ERR_PROTOCOL] = "protocol",
    [MB_ERR_TLS] = "tls",
    [MB_ERR_IMAP_NO] = "NO",
    [MB_ERR_IMAP_BAD] = "BAD",
};

static const char *const mailbench_mode_names[] = { "lmtp", "imap", "mixed" };

const char *mailbench_lat_name(const struct mb_run *run, int lat)
{
    /* both parts connect: in mixed mode IMAP's is told apart */
    if (lat == MB_LAT_IMAP_CONNECT && run->opt.mode == MB_MODE_MIXED)
        return "IMAP-CONNECT";
    return mailbench_lat_names[lat];
}

/* ---- samples -------------------------------------------------------------- */

static uint32_t mailbench_us(double seconds)
{
    double us = seconds * 1e6;

    if (!(us > 0))
        return 0;
    if (us >= 4294967295.0)
        return UINT32_MAX;
    return (uint32_t)(us + 0.5);
}

void mailbench_sample_add(struct mb_samples *s, double seconds)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->us = mailbench_realloc(s->us, s->cap * sizeof(*s->us));
    }
    s->us[s->n++] = mailbench_us(seconds);
}

void mailbench_series_add(struct mb_series *s, double at, double seconds)
{
    uint64_t sec = at > 0 ? (uint64_t)at : 0;

    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = mailbench_realloc(s->v, s->cap * sizeof(*s->v));
    }
    s->v[s->n++] = (sec << 32) | mailbench_us(seconds);
}

static int mailbench_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

static int mailbench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* The nearest rank (1..n) of percentile p among n sorted values. */
static size_t mailbench_rank(size_t n, double p)
{
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);

    if (rank < 1)
        rank = 1;
    return rank > n ? n : rank;
}

/* Nearest-rank percentile of sorted values, in ms. */
static double mailbench_pct(const uint32_t *sorted, size_t n, double p)
{
    return n ? sorted[mailbench_rank(n, p) - 1] / 1000.0 : 0;
}

static double mailbench_pct64(const uint64_t *sorted, size_t n, double p)
{
    return n ? (double)(sorted[mailbench_rank(n, p) - 1] & 0xffffffffu) /
                   1000.0
             : 0;
}

struct mb_stat {
    size_t count;
    double p50, p90, p99, max;
};

static struct mb_stat mailbench_stat(struct mb_samples *s)
{
    struct mb_stat st = { 0, 0, 0, 0, 0 };

    if (s->n == 0)
        return st;
    qsort(s->us, s->n, sizeof(*s->us), mailbench_cmp_u32);
    st.count = s->n;
    st.p50 = mailbench_pct(s->us, s->n, 50);
    st.p90 = mailbench_pct(s->us, s->n, 90);
    st.p99 = mailbench_pct(s->us, s->n, 99);
    st.max = s->us[s->n - 1] / 1000.0;
    return st;
}

void mailbench_report_free(struct mb_run *run)
{
    for (int i = 0; i < MB_LAT_COUNT; i++)
        free(run->lat[i].us);
    free(run->lmtp_series.v);
    free(run->imap_series.v);
}

/* ---- the host ------------------------------------------------------------- */

static int mailbench_disk_counted(const char *name)
{
    static const char *const skip[] = { "loop", "ram", "zram", "dm-" };
    char path[300];

    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++)
        if (strncmp(name, skip[i], strlen(skip[i])) == 0)
            return 0;
    snprintf(path, sizeof(path), "/sys/block/%s", name);
    return access(path, F_OK) == 0;
}

void mailbench_host_read(struct mb_host *h)
{
    FILE *f;
    char line[512];

    memset(h, 0, sizeof(*h));
    f = fopen("/proc/stat", "r");
    if (f) {
        unsigned long long v[10] = { 0 };

        if (fgets(line, sizeof(line), f)
            && sscanf(line, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
                      &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                      &v[7]) >= 5) {
            h->cpu_user = v[0] + v[1];
            h->cpu_sys = v[2] + v[5] + v[6];
            h->cpu_idle = v[3];
            h->cpu_iowait = v[4];
            h->cpu_total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6]
                + v[7];
        }
        fclose(f);
    }
    f = fopen("/proc/diskstats", "r");
    if (f) {
        while (fgets(line, sizeof(line), f) && h->ndisks < MB_MAX_DISKS) {
            unsigned maj, min;
            char name[64];
            unsigned long long rios, rmerge, rsect, rticks, wios, wmerge,
                wsect;

            if (sscanf(line, "%u %u %63s %llu %llu %llu %llu %llu %llu %llu",
                       &maj, &min, name, &rios, &rmerge, &rsect, &rticks,
                       &wios, &wmerge, &wsect) != 10)
                continue;
            if (!mailbench_disk_counted(name))
                continue;
            snprintf(h->disk_name[h->ndisks], sizeof(h->disk_name[0]), "%s",
                     name);
            h->disk_wios[h->ndisks] = wios;
            h->disk_wsect[h->ndisks] = wsect;
            h->ndisks++;
        }
        fclose(f);
    }
}

struct mb_hostdelta {
    double user, sys, iowait, idle;     /* percent */
    unsigned long long wios;
    double wmb;
    unsigned ndisks;
    char name[MB_MAX_DISKS][64];
    unsigned long long disk_wios[MB_MAX_DISKS];
    double disk_wmb[MB_MAX_DISKS];
};

static void mailbench_host_delta(const struct mb_run *run,
                                 struct mb_hostdelta *d)
{
    const struct mb_host *a = &run->host_start, *b = &run->host_end;
    double total = (double)(b->cpu_total - a->cpu_total);

    memset(d, 0, sizeof(*d));
    if (total > 0) {
        d->user = 100.0 * (double)(b->cpu_user - a->cpu_user) / total;
        d->sys = 100.0 * (double)(b->cpu_sys - a->cpu_sys) / total;
        d->iowait = 100.0 * (double)(b->cpu_iowait - a->cpu_iowait) / total;
        d->idle = 100.0 * (double)(b->cpu_idle - a->cpu_idle) / total;
    }
    for (unsigned i = 0; i < b->ndisks; i++) {
        unsigned long long wios = b->disk_wios[i], wsect = b->disk_wsect[i];

        for (unsigned j = 0; j < a->ndisks; j++) {
            if (strcmp(a->disk_name[j], b->disk_name[i]) == 0) {
                wios -= a->disk_wios[j];
                wsect -= a->disk_wsect[j];
                break;
            }
        }
        memcpy(d->name[d->ndisks], b->disk_name[i], sizeof(d->name[0]));
        d->disk_wios[d->ndisks] = wios;
        d->disk_wmb[d->ndisks] = (double)wsect * 512.0 / 1e6;
        d->wios += wios;
        d->wmb += d->disk_wmb[d->ndisks];
        d->ndisks++;
    }
}

static void mailbench_loadavg(struct mb_run *run)
{
    FILE *f = fopen("/proc/loadavg", "r");

    if (!f)
        return;
    if (fscanf(f, "%lf %lf %lf", &run->load[0], &run->load[1],
               &run->load[2]) != 3)
        run->load[0] = run->load[1] = run->load[2] = 0;
    fclose(f);
}

/* ---- progress ------------------------------------------------------------- */

void mailbench_progress(struct mb_run *run, int final)
{
    double now = mailbench_now();
    char line[256];

    if (strcmp(run->phase_name ? run->phase_name : "", "verify") == 0) {
        snprintf(line, sizeof(line), "verify %lu/%lu users  %lu failures",
                 run->verify.done_users, run->nusers, run->verify.failures);
    } else {
        double el = now - run->t_run_start;

        if (run->opt.mode == MB_MODE_IMAP) {
            snprintf(line, sizeof(line), "imap %lu/%lu sessions  %.1f ops/s  "
                     "%lu errors  %.1f s", run->imap.finished,
                     run->opt.imap_n, el > 0 ? run->imap.ops / el : 0.0,
                     mailbench_error_total(run), el);
        } else {
            int n = snprintf(line, sizeof(line), "lmtp %lu/%lu msgs  %.1f "
                             "msg/s  %lu errors  %.1f s", run->lmtp.done,
                             run->opt.msgs,
                             el > 0 ? run->lmtp.delivered_msgs / el : 0.0,
                             mailbench_error_total(run), el);
            if (run->opt.mode == MB_MODE_MIXED && n > 0
                && (size_t)n < sizeof(line))
                snprintf(line + n, sizeof(line) - (size_t)n,
                         "  imap %lu ops", run->imap.ops);
        }
    }
    fprintf(stderr, "\r\033[K%s%s", line, final ? "\n" : "");
    fflush(stderr);
}

/* ---- the figures ---------------------------------------------------------- */

struct mb_figures {
    double elapsed, lmtp_elapsed;
    double msgs_per_s, rcpts_per_s, ops_per_s;
    struct mb_stat lat[MB_LAT_COUNT];
    struct mb_hostdelta host;
    const char *target;
    unsigned conns;
};

static void mailbench_figures(struct mb_run *run, struct mb_figures *f)
{
    memset(f, 0, sizeof(*f));
    f->elapsed = run->t_run_end - run->t_run_start;
    f->lmtp_elapsed = (run->lmtp.t_end > 0 ? run->lmtp.t_end
                       : run->t_run_end) - run->t_run_start;
    if (f->lmtp_elapsed > 0) {
        f->msgs_per_s = run->lmtp.delivered_msgs / f->lmtp_elapsed;
        f->rcpts_per_s = run->lmtp.delivered_rcpts / f->lmtp_elapsed;
    }
    if (f->elapsed > 0)
        f->ops_per_s = run->imap.ops / f->elapsed;
    for (int i = 0; i < MB_LAT_COUNT; i++)
        f->lat[i] = mailbench_stat(&run->lat[i]);
    mailbench_host_delta(run, &f->host);
    mailbench_loadavg(run);
    if (run->opt.mode == MB_MODE_IMAP) {
        f->target = run->opt.imap_spec;
        f->conns = run->imap.sessions;
    } else {
        f->target = run->opt.lmtp_spec;
        f->conns = run->opt.conns;
    }
}

static const char *mailbench_verify_word(const struct mb_run *run)
{
    if (run->opt.verify == MB_VERIFY_NONE)
        return "none";
    if (!run->verify.ran)
        return "not run";
    return run->verify.mismatches == 0 && run->verify.failures == 0
        ? "ok" : "FAILED";
}

static void mailbench_table(struct mb_run *run, struct mb_figures *f)
{
    const struct mb_options *o = &run->opt;
    struct mb_hostdelta *h = &f->host;

    printf("mailbench %s  label=%s  target=%s  conns=%u", 
           mailbench_mode_names[o->mode], *o->label ? o->label : "-",
           f->target, f->conns);
    if (o->mode != MB_MODE_IMAP)
        printf("  msgs=%lu  size=%lu  rcpts=%u  mailboxes=%lu", o->msgs,
               o->size, o->rcpts, run->nusers);
    printf("\n");
    if (o->mode != MB_MODE_IMAP) {
        printf("delivered      %lu msgs   %lu rcpts   in %.2f s   = %.1f "
               "msgs/s  %.1f rcpts/s\n", run->lmtp.delivered_msgs,
               run->lmtp.delivered_rcpts, f->lmtp_elapsed, f->msgs_per_s,
               f->rcpts_per_s);
        if (o->dup_pct > 0)
            printf("duplicates     %lu sent  %lu accepted  (--dup %g%%, "
                   "dedup %s)\n", run->lmtp.dups_sent,
                   run->lmtp.dups_delivered, o->dup_pct,
                   o->dedup ? "yes" : "no");
        if (o->lmtp_rate > 0)
            printf("paced          --lmtp-rate %g msgs/s\n", o->lmtp_rate);
    }
    if (o->mode != MB_MODE_LMTP)
        printf("imap           %lu sessions  %lu ops   in %.2f s   = %.1f "
               "ops/s  skipped %lu  expunged %lu  fetched %.1f MB\n",
               run->imap.finished, run->imap.ops, f->elapsed, f->ops_per_s,
               run->imap.skipped, run->imap.expunged,
               run->imap.fetch_bytes / 1e6);

    printf("errors         %lu", mailbench_error_total(run));
    int any = 0;
    for (int i = 0; i < 1000; i++) {
        if (run->err_code[i]) {
            printf("%s%03d=%lu", any ? " " : "   (", i, run->err_code[i]);
            any = 1;
        }
    }
    for (int i = 0; i < MB_ERR_COUNT; i++) {
        if (run->err_kind[i]) {
            printf("%s%s=%lu", any ? " " : "   (", mailbench_err_names[i],
                   run->err_kind[i]);
            any = 1;
        }
    }
    if (any)
        printf(")");
    if (o->mode != MB_MODE_IMAP && run->lmtp.failed_msgs)
        printf("   failed msgs %lu", run->lmtp.failed_msgs);
    printf("   verify: %s", mailbench_verify_word(run));
    if (run->verify.ran)
        printf(" (%lu users, %lu mismatches%s)", run->verify.checked,
               run->verify.mismatches,
               run->verify.failures ? ", some not counted" : "");
    printf("\n");

    printf("%-13s %8s %9s %9s %9s %9s\n", "command", "count", "p50 ms",
           "p90 ms", "p99 ms", "max ms");
    for (int i = 0; i < MB_LAT_COUNT; i++) {
        struct mb_stat *s = &f->lat[i];

        if (s->count == 0)
            continue;
        printf("%-13s %8zu %9.2f %9.2f %9.2f %9.2f\n",
               mailbench_lat_name(run, i), s->count, s->p50, s->p90, s->p99,
               s->max);
    }
    printf("host: load %.2f %.2f %.2f   cpu user %.0f%% sys %.0f%% iowait "
           "%.0f%% idle %.0f%%\n", run->load[0], run->load[1], run->load[2],
           h->user, h->sys, h->iowait, h->idle);
    printf("      disk writes %llu ops %.1f MB", h->wios, h->wmb);
    if (h->ndisks) {
        printf(" (");
        for (unsigned i = 0; i < h->ndisks; i++)
            printf("%s%s", i ? " " : "", h->name[i]);
        printf(")");
    }
    printf("   mailbench cpu %.2f s (%.0f%% of one core)\n", run->self_cpu_s,
           f->elapsed > 0 ? 100.0 * run->self_cpu_s / f->elapsed : 0.0);
    fflush(stdout);
}

/* ---- JSON and CSV ---------------------------------------------------------- */

static void mailbench_json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

static FILE *mailbench_open_out(const char *path, int *close_r)
{
    FILE *f;

    if (strcmp(path, "-") == 0) {
        *close_r = 0;
        return stdout;
    }
    f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "mailbench: cannot write %s: %s\n", path,
                strerror(errno));
    *close_r = 1;
    return f;
}

static int mailbench_close_out(FILE *f, int do_close, const char *path)
{
    int bad = ferror(f);

    if (do_close)
        bad |= fclose(f) != 0;
    else
        bad |= fflush(f) != 0;
    if (bad) {
        fprintf(stderr, "mailbench: error writing %s\n", path);
        return -1;
    }
    return 0;
}

static int mailbench_json(struct mb_run *run, struct mb_figures *f)
{
    const struct mb_options *o = &run->opt;
    struct mb_hostdelta *h = &f->host;
    int do_close;
    FILE *out = mailbench_open_out(o->json, &do_close);

    if (!out)
        return -1;
    fprintf(out, "{\"mode\": ");
    mailbench_json_str(out, mailbench_mode_names[o->mode]);
    fprintf(out, ", \"label\": ");
    mailbench_json_str(out, o->label);
    fprintf(out, ", \"target\": ");
    mailbench_json_str(out, f->target);
    if (o->mode == MB_MODE_MIXED) {
        fprintf(out, ", \"imap_target\": ");
        mailbench_json_str(out, o->imap_spec);
    }
    fprintf(out, ", \"conns\": %u, \"seed\": %llu", f->conns,
            (unsigned long long)o->seed);
    if (o->mode != MB_MODE_IMAP)
        fprintf(out, ", \"msgs\": %lu, \"size\": %lu, \"rcpts\": %u, "
                "\"mailboxes\": %lu", o->msgs, o->size, o->rcpts,
                run->nusers);
    else
        fprintf(out, ", \"msgs\": 0, \"size\": 0, \"rcpts\": 0");
    fprintf(out, ", \"elapsed_s\": %.4f, \"delivered_msgs\": %lu, "
            "\"delivered_rcpts\": %lu, \"failed_msgs\": %lu, "
            "\"msgs_per_s\": %.2f, \"rcpts_per_s\": %.2f",
            o->mode == MB_MODE_IMAP ? f->elapsed : f->lmtp_elapsed,
            run->lmtp.delivered_msgs, run->lmtp.delivered_rcpts,
            run->lmtp.failed_msgs, f->msgs_per_s, f->rcpts_per_s);
    fprintf(out, ", \"dup_pct\": %g, \"dups_sent\": %lu, "
            "\"dups_delivered\": %lu, \"dedup\": %s", o->dup_pct,
            run->lmtp.dups_sent, run->lmtp.dups_delivered,
            o->dedup ? "true" : "false");
    fprintf(out, ", \"lmtp_rate\": %g", o->lmtp_rate);
    fprintf(out, ", \"errors\": {");
    int first = 1;
    for (int i = 0; i < 1000; i++) {
        if (run->err_code[i]) {
            fprintf(out, "%s\"%03d\": %lu", first ? "" : ", ", i,
                    run->err_code[i]);
            first = 0;
        }
    }
    for (int i = 0; i < MB_ERR_COUNT; i++) {
        if (run->err_kind[i]) {
            fprintf(out, "%s\"%s\": %lu", first ? "" : ", ",
                    mailbench_err_names[i], run->err_kind[i]);
            first = 0;
        }
    }
    fprintf(out, "}, \"error_total\": %lu", mailbench_error_total(run));
    fprintf(out, ", \"verify\": {\"mode\": \"%s\", \"checked\": %lu, "
            "\"mismatches\": %lu, \"failures\": %lu, \"ok\": %s}",
            o->verify == MB_VERIFY_NONE ? "none"
            : o->verify == MB_VERIFY_IMAP ? "imap" : "cmd",
            run->verify.checked, run->verify.mismatches,
            run->verify.failures,
            !run->verify.ran ? "null"
            : (run->verify.mismatches == 0 && run->verify.failures == 0)
            ? "true" : "false");
    fprintf(out, ", \"latency_ms\": {");
    first = 1;
    for (int i = 0; i < MB_LAT_COUNT; i++) {
        struct mb_stat *s = &f->lat[i];

        if (s->count == 0)
            continue;
        fprintf(out, "%s\"%s\": {\"count\": %zu, \"p50\": %.3f, \"p90\": "
                "%.3f, \"p99\": %.3f, \"max\": %.3f}", first ? "" : ", ",
                mailbench_lat_name(run, i), s->count, s->p50, s->p90, s->p99,
                s->max);
        first = 0;
    }
    fprintf(out, "}");
    if (o->mode != MB_MODE_LMTP)
        fprintf(out, ", \"imap\": {\"sessions\": %lu, \"failed_sessions\": "
                "%lu, \"ops\": %lu, \"ops_per_s\": %.2f, \"skipped\": %lu, "
                "\"expunged\": %lu, \"fetch_bytes\": %lu, \"concurrency\": "
                "%u, \"elapsed_s\": %.4f}", run->imap.finished,
                run->imap.failed_sessions, run->imap.ops, f->ops_per_s,
                run->imap.skipped, run->imap.expunged, run->imap.fetch_bytes,
                run->imap.sessions, f->elapsed);
    fprintf(out, ", \"host\": {\"load1\": %.2f, \"load5\": %.2f, \"load15\": "
            "%.2f, \"cpu_user_pct\": %.1f, \"cpu_sys_pct\": %.1f, "
            "\"cpu_iowait_pct\": %.1f, \"cpu_idle_pct\": %.1f, "
            "\"disk_write_ops\": %llu, \"disk_write_mb\": %.2f, \"disks\": [",
            run->load[0], run->load[1], run->load[2], h->user, h->sys,
            h->iowait, h->idle, h->wios, h->wmb);
    for (unsigned i = 0; i < h->ndisks; i++) {
        fprintf(out, "%s{\"name\": ", i ? ", " : "");
        mailbench_json_str(out, h->name[i]);
        fprintf(out, ", \"write_ops\": %llu, \"write_mb\": %.2f}",
                h->disk_wios[i], h->disk_wmb[i]);
    }
    fprintf(out, "]}, \"self_cpu_s\": %.3f, \"self_cpu_pct\": %.1f}\n",
            run->self_cpu_s,
            f->elapsed > 0 ? 100.0 * run->self_cpu_s / f->elapsed : 0.0);
    return mailbench_close_out(out, do_close, o->json);
}

static void mailbench_csv_str(FILE *out, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

static int mailbench_csv(struct mb_run *run, struct mb_figures *f)
{
    const struct mb_options *o = &run->opt;
    struct mb_hostdelta *h = &f->host;
    int do_close;
    FILE *out = mailbench_open_out(o->csv, &do_close);

    if (!out)
        return -1;
    fprintf(out, "metric,value\nmode,%s\nlabel,",
            mailbench_mode_names[o->mode]);
    mailbench_csv_str(out, o->label);
    fprintf(out, "\ntarget,");
    mailbench_csv_str(out, f->target);
    fprintf(out, "\nconns,%u\n", f->conns);
    if (o->mode != MB_MODE_IMAP)
        fprintf(out, "msgs,%lu\nsize,%lu\nrcpts,%u\nmailboxes,%lu\n",
                o->msgs, o->size, o->rcpts, run->nusers);
    fprintf(out, "elapsed_s,%.4f\ndelivered_msgs,%lu\ndelivered_rcpts,%lu\n"
            "failed_msgs,%lu\nmsgs_per_s,%.2f\nrcpts_per_s,%.2f\n"
            "dups_sent,%lu\ndups_delivered,%lu\n",
            o->mode == MB_MODE_IMAP ? f->elapsed : f->lmtp_elapsed,
            run->lmtp.delivered_msgs, run->lmtp.delivered_rcpts,
            run->lmtp.failed_msgs, f->msgs_per_s, f->rcpts_per_s,
            run->lmtp.dups_sent, run->lmtp.dups_delivered);
    for (int i = 0; i < 1000; i++)
        if (run->err_code[i])
            fprintf(out, "errors.%03d,%lu\n", i, run->err_code[i]);
    for (int i = 0; i < MB_ERR_COUNT; i++)
        if (run->err_kind[i])
            fprintf(out, "errors.%s,%lu\n", mailbench_err_names[i],
                    run->err_kind[i]);
    fprintf(out, "error_total,%lu\n", mailbench_error_total(run));
    fprintf(out, "verify.checked,%lu\nverify.mismatches,%lu\n"
            "verify.failures,%lu\nverify.ok,%s\n", run->verify.checked,
            run->verify.mismatches, run->verify.failures,
            !run->verify.ran ? ""
            : (run->verify.mismatches == 0 && run->verify.failures == 0)
            ? "true" : "false");
    for (int i = 0; i < MB_LAT_COUNT; i++) {
        struct mb_stat *s = &f->lat[i];
        const char *n = mailbench_lat_name(run, i);

        if (s->count == 0)
            continue;
        fprintf(out, "latency_ms.%s.count,%zu\nlatency_ms.%s.p50,%.3f\n"
                "latency_ms.%s.p90,%.3f\nlatency_ms.%s.p99,%.3f\n"
                "latency_ms.%s.max,%.3f\n", n, s->count, n, s->p50, n,
                s->p90, n, s->p99, n, s->max);
    }
    if (o->mode != MB_MODE_LMTP)
        fprintf(out, "imap.sessions,%lu\nimap.failed_sessions,%lu\n"
                "imap.ops,%lu\nimap.ops_per_s,%.2f\nimap.skipped,%lu\n"
                "imap.expunged,%lu\nimap.fetch_bytes,%lu\n",
                run->imap.finished, run->imap.failed_sessions, run->imap.ops,
                f->ops_per_s, run->imap.skipped, run->imap.expunged,
                run->imap.fetch_bytes);
    fprintf(out, "host.load1,%.2f\nhost.load5,%.2f\nhost.load15,%.2f\n"
            "host.cpu_user_pct,%.1f\nhost.cpu_sys_pct,%.1f\n"
            "host.cpu_iowait_pct,%.1f\nhost.cpu_idle_pct,%.1f\n"
            "host.disk_write_ops,%llu\nhost.disk_write_mb,%.2f\n",
            run->load[0], run->load[1], run->load[2], h->user, h->sys,
            h->iowait, h->idle, h->wios, h->wmb);
    for (unsigned i = 0; i < h->ndisks; i++)
        fprintf(out, "host.disk.%s.write_ops,%llu\nhost.disk.%s.write_mb,"
                "%.2f\n", h->name[i], h->disk_wios[i], h->name[i],
                h->disk_wmb[i]);
    fprintf(out, "self_cpu_s,%.3f\n", run->self_cpu_s);
    return mailbench_close_out(out, do_close, o->csv);
}

/* ---- the plot --------------------------------------------------------------- */

static int mailbench_run_gnuplot(const char *script)
{
    pid_t pid = fork();
    int status;

    if (pid < 0)
        return -1;
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);

        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int mailbench_plot(struct mb_run *run)
{
    const struct mb_options *o = &run->opt;
    const char *tmp = getenv("TMPDIR");
    char data[512], script[512];
    int fd;
    FILE *f;
    int rc = -1;
    double el = run->t_run_end - run->t_run_start;
    unsigned long seconds = (unsigned long)el + 1;
    int lmtp = o->mode != MB_MODE_IMAP, imap = o->mode != MB_MODE_LMTP;

    if (!tmp || !*tmp)
        tmp = "/tmp";
    snprintf(data, sizeof(data), "%s/mailbench-plot.XXXXXX", tmp);
    snprintf(script, sizeof(script), "%s/mailbench-gp.XXXXXX", tmp);
    fd = mkstemp(data);
    if (fd < 0 || !(f = fdopen(fd, "w"))) {
        fprintf(stderr, "mailbench: --plot: cannot create a file in %s: %s\n",
                tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    /* columns: second, then count p50 p99 for LMTP and for IMAP */
    struct mb_series *lser = &run->lmtp_series, *iser = &run->imap_series;
    qsort(lser->v, lser->n, sizeof(*lser->v), mailbench_cmp_u64);
    qsort(iser->v, iser->n, sizeof(*iser->v), mailbench_cmp_u64);
    size_t li = 0, ii = 0;
    for (unsigned long sec = 0; sec < seconds; sec++) {
        size_t ls = li, is = ii;

        while (li < lser->n && (lser->v[li] >> 32) == sec)
            li++;
        while (ii < iser->n && (iser->v[ii] >> 32) == sec)
            ii++;
        /* the last second is partial: its count scaled to a rate */
        double frac = sec + 1 == seconds ? el - (double)sec : 1.0;
        if (frac < 0.05)
            frac = 1.0;
        fprintf(f, "%lu %.1f %.3f %.3f %.1f %.3f %.3f\n", sec,
                (double)(li - ls) / frac,
                mailbench_pct64(lser->v + ls, li - ls, 50),
                mailbench_pct64(lser->v + ls, li - ls, 99),
                (double)(ii - is) / frac,
                mailbench_pct64(iser->v + is, ii - is, 50),
                mailbench_pct64(iser->v + is, ii - is, 99));
    }
    if (fclose(f) != 0)
        goto out_data;

    for (int attempt = 0; attempt < 2 && rc < 0; attempt++) {
        fd = mkstemp(script);
        if (fd < 0 || !(f = fdopen(fd, "w"))) {
            if (fd >= 0)
                close(fd);
            break;
        }
        fprintf(f, "set terminal %s size 1000,600\n",
                attempt == 0 ? "pngcairo" : "png");
        fprintf(f, "set output '%s'\n", o->plot);
        fprintf(f, "set title \"mailbench %s%s%s\" noenhanced\n",
                mailbench_mode_names[o->mode], *o->label ? " " : "",
                o->label);
        fprintf(f, "set xlabel 'seconds'\nset ylabel 'per second'\n"
                "set y2label 'latency ms'\nset ytics nomirror\nset y2tics\n"
                "set xrange [0:*]\nset yrange [0:*]\nset y2range [0:*]\nset key outside bottom center horizontal\n"
                "set grid\n");
        fprintf(f, "plot ");
        int first = 1;
        if (lmtp) {
            fprintf(f, "'%s' using 1:2 with linespoints pt 7 ps 0.6 lw 2 title 'messages/s' "
                    "axes x1y1, '%s' using 1:3 with linespoints pt 7 ps 0.4 title 'delivery "
                    "p50 ms' axes x1y2, '%s' using 1:4 with linespoints pt 7 ps 0.4 title "
                    "'delivery p99 ms' axes x1y2", data, data, data);
            first = 0;
        }
        if (imap)
            fprintf(f, "%s'%s' using 1:5 with linespoints pt 7 ps 0.6 lw 2 title 'IMAP ops/s' "
                    "axes x1y1, '%s' using 1:6 with linespoints pt 7 ps 0.4 title 'IMAP p50 "
                    "ms' axes x1y2, '%s' using 1:7 with linespoints pt 7 ps 0.4 title 'IMAP "
                    "p99 ms' axes x1y2", first ? "" : ", ", data, data, data);
        fprintf(f, "\n");
        if (fclose(f) != 0) {
            unlink(script);
            break;
        }
        if (mailbench_run_gnuplot(script) == 0)
            rc = 0;
        unlink(script);
        snprintf(script, sizeof(script), "%s/mailbench-gp.XXXXXX", tmp);
    }
    if (rc == 0) {
        unsigned char magic[8] = { 0 };
        FILE *p = fopen(o->plot, "rb");

        if (!p || fread(magic, 1, 8, p) != 8
            || memcmp(magic, "\x89PNG\r\n\x1a\n", 8) != 0)
            rc = -1;
        if (p)
            fclose(p);
    }
    if (rc < 0)
        fprintf(stderr, "mailbench: --plot: gnuplot could not draw %s\n",
                o->plot);
out_data:
    unlink(data);
    return rc;
}

int mailbench_report(struct mb_run *run)
{
    struct mb_figures f;
    int rc = 0;

    mailbench_figures(run, &f);
    mailbench_table(run, &f);
    if (run->opt.json && mailbench_json(run, &f) < 0)
        rc = -1;
    if (run->opt.csv && mailbench_csv(run, &f) < 0)
        rc = -1;
    if (run->opt.plot && mailbench_plot(run) < 0)
        rc = -1;
    return rc;
}

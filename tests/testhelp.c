/*
 * testhelp.c - see testhelp.h.
 */
#include "config.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "tests/testhelp.h"

char *th_mkdtemp(const char *tag)
{
    const char *base = getenv("TEST_TMPDIR");
    const char *top = getenv("top_builddir");
    char tmpl[4096];
    char *d;

    if (!base || !*base) {
        snprintf(tmpl, sizeof(tmpl), "%s/tests/tmp", top && *top ? top : ".");
        base = tmpl;
    }
    if (fs_mkdir_p(base, 0755) < 0) {
        fprintf(stderr, "cannot create %s: %s\n", base, strerror(errno));
        abort();
    }
    if (asprintf(&d, "%s/%s.XXXXXX", base, tag ? tag : "t") < 0)
        abort();
    if (!mkdtemp(d)) {
        fprintf(stderr, "mkdtemp %s: %s\n", d, strerror(errno));
        abort();
    }
    return d;
}

void th_rmrf(const char *path)
{
    struct stat st;
    DIR *dir;
    struct dirent *de;

    if (lstat(path, &st) < 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    dir = opendir(path);
    if (dir) {
        while ((de = readdir(dir)) != NULL) {
            char *sub;
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            sub = th_path(path, de->d_name);
            th_rmrf(sub);
            free(sub);
        }
        closedir(dir);
    }
    rmdir(path);
}

char *th_path(const char *dir, const char *name)
{
    char *p;

    if (asprintf(&p, "%s/%s", dir, name) < 0)
        abort();
    return p;
}

/* The etcd backend's settings from $TEST_ETCD_ENDPOINTS (and
 * $TEST_ETCD_PREFIX, $TEST_ETCD_TIMEOUT), as imapd.conf would give them. */
static void th_etcd_configure(void)
{
    const char *ep = getenv("TEST_ETCD_ENDPOINTS");
    const char *pfx = getenv("TEST_ETCD_PREFIX");
    const char *tmo = getenv("TEST_ETCD_TIMEOUT");
    struct imapconf *conf = NULL;
    char *err = NULL, *text = NULL;
    int n;

    if (!ep || !*ep)
        return;
    n = asprintf(&text, "etcd_endpoints: %s\netcd_prefix: %s\netcd_timeout: %s\n",
                 ep, pfx && *pfx ? pfx : "/cyrusdeliver-test/",
                 tmo && *tmo ? tmo : "5000");
    if (n < 0 || imapconf_load_string("TEST_ETCD_ENDPOINTS", text, (size_t)n,
                                      &conf, &err) < 0) {
        fprintf(stderr, "testhelp: bad $TEST_ETCD_*: %s\n", err ? err : "?");
        exit(2);
    }
    cyrusdb_etcd_configure(conf);
    imapconf_free(&conf);
    free(text);
}

const char *const *th_backends(void)
{
    static const char *list[32];
    static char envcopy[512];
    const struct cyrusdb_registry_entry *e;
    const char *env = getenv("TEST_BACKENDS");
    size_t n = 0;

    if (list[0])
        return list;
    if (env && *env) {
        char *tok, *save = NULL;
        snprintf(envcopy, sizeof(envcopy), "%s", env);
        for (tok = strtok_r(envcopy, " ,", &save); tok && n < 31;
             tok = strtok_r(NULL, " ,", &save))
            list[n++] = tok;
    } else {
        for (e = cyrusdb_registry; e->name && n < 31; e++) {
            if (!strncmp(e->name, "berkeley", 8))
                continue;   /* aliases of db3 */
            if (e->nofile)
                continue;   /* needs a server: only when named */
            list[n++] = e->name;
        }
    }
    list[n] = NULL;
    th_etcd_configure();
    return list;
}

void th_fill(void *buf, size_t len, unsigned seed)
{
    unsigned char *p = buf;
    unsigned x = seed * 2654435761u + 1;
    size_t i;

    for (i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

int th_ref_compare(int flags, const char *a, size_t alen,
                   const char *b, size_t blen)
{
    size_t i;

    for (i = 0; i < alen && i < blen; i++) {
        unsigned ca = (unsigned char)a[i], cb = (unsigned char)b[i];
        if (ca == cb)
            continue;
        if (flags & CYRUSDB_MBOXSORT) {
            if (ca == '.')
                return -1;
            if (cb == '.')
                return 1;
        }
        return ca < cb ? -1 : 1;
    }
    if (alen == blen)
        return 0;
    return alen < blen ? -1 : 1;
}

int th_run_per_backend(const char *group, const struct th_case *cases,
                       size_t ncases)
{
    const char *const *backends = th_backends();
    struct CMUnitTest *tests;
    char **names;
    size_t nb = 0, n = 0, i, b;
    int rc;

    while (backends[nb])
        nb++;
    tests = calloc(nb * ncases + 1, sizeof(*tests));
    names = calloc(nb * ncases + 1, sizeof(*names));
    if (!tests || !names)
        return 1;
    for (i = 0; i < ncases; i++) {
        for (b = 0; b < nb; b++) {
            if (asprintf(&names[n], "%s/%s", cases[i].name, backends[b]) < 0)
                return 1;
            tests[n].name = names[n];
            tests[n].test_func = cases[i].fn;
            tests[n].initial_state = (void *)(uintptr_t)backends[b];
            n++;
        }
    }
    rc = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    for (i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(tests);
    return rc;
}

double th_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void th_sleep_us(double us)
{
    struct timespec ts;

    if (us <= 0)
        return;
    ts.tv_sec = (time_t)(us / 1e6);
    ts.tv_nsec = (long)((us - (double)ts.tv_sec * 1e6) * 1000);
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
        ;
}

static int th_double_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

double th_median(const double *v, size_t n)
{
    double *c = malloc(n * sizeof(*c)), m;

    if (!c)
        return v[0];
    memcpy(c, v, n * sizeof(*c));
    qsort(c, n, sizeof(*c), th_double_cmp);
    m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

void th_timing_add(struct th_timing *t, double seconds)
{
    t->v[t->next] = seconds;
    t->next = (t->next + 1) % TH_TIMING_SAMPLES;
    if (t->n < TH_TIMING_SAMPLES)
        t->n++;
}

double th_timing_median(const struct th_timing *t)
{
    return t->n ? th_median(t->v, t->n) : 0;
}

void th_stretch_note(struct th_stretch *s, int after)
{
    unsigned before_n, after_n, low = 2 * TH_STRETCH_BLOCK / 10;

    if (after)
        s->after[1]++;
    else
        s->before[1]++;
    if (++s->n % TH_STRETCH_BLOCK != 0)
        return;
    before_n = s->before[0] + s->before[1];
    after_n = s->after[0] + s->after[1];
    if (s->n >= 2 * TH_STRETCH_BLOCK) {
        if (after_n < low && s->factor < 1024)
            s->factor *= 2;
        else if (before_n < low && s->factor > 1.0 / 1024)
            s->factor /= 2;
    }
    s->before[0] = s->before[1];
    s->after[0] = s->after[1];
    s->before[1] = s->after[1] = 0;
}

void th_child_signals(void)
{
    static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGABRT, SIGALRM };
    size_t i;

    for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        signal(sigs[i], SIG_DFL);
}

const char *th_status_text(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "signal %d (%s)", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? "alarm: a hang" : strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "status %#x", status);
    return buf;
}

long th_parse_long(const char *data, size_t len)
{
    long v = 0;
    size_t i;

    if (!data || len == 0 || len > 18)
        return -1;
    for (i = 0; i < len; i++) {
        if (data[i] < '0' || data[i] > '9')
            return -1;
        v = v * 10 + (data[i] - '0');
    }
    return v;
}

struct imapconf *th_store_conf(const char *dir, const char *backend,
                               const char *extra)
{
    static const char *const keys[] = {
        "mboxlist_db", "duplicate_db", "seenstate_db", "subscription_db",
        "quota_db", NULL
    };
    struct buf text = BUF_INITIALIZER;
    struct imapconf *conf = NULL;
    char *confdir = th_path(dir, "conf");
    char *spool = th_path(dir, "spool");
    char *fname = th_path(dir, "imapd.conf");
    char *err = NULL;
    FILE *f;
    int i;

    assert_int_equal(fs_mkdir_p(confdir, 0755), 0);
    assert_int_equal(fs_mkdir_p(spool, 0755), 0);
    buf_printf(&text, "configdirectory: %s\npartition-default: %s\n",
               confdir, spool);
    for (i = 0; keys[i]; i++)
        buf_printf(&text, "%s: %s\n", keys[i], backend);
    if (extra)
        buf_appendcstr(&text, extra);
    f = fopen(fname, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text.s, 1, text.len, f), text.len);
    assert_int_equal(fclose(f), 0);
    if (imapconf_load(fname, &conf, &err) != 0)
        fail_msg("th_store_conf: %s", err ? err : "out of memory");
    buf_free(&text);
    free(confdir);
    free(spool);
    free(fname);
    return conf;
}

struct imapconf *th_store_conf_vd(const char *dir, const char *backend,
                                  const char *extra)
{
    struct buf text = BUF_INITIALIZER;
    struct imapconf *conf;

    buf_printf(&text, "virtdomains: on\ndefaultdomain: default.example\n%s",
               extra ? extra : "");
    conf = th_store_conf(dir, backend, buf_cstring(&text));
    buf_free(&text);
    return conf;
}

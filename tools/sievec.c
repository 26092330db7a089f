/*
 * sievec.c - check a Sieve script, or run it against a message.
 *
 *   sievec [-x ext,...] [-o file.bc] script
 *       compile and check: prints "OK", or "line N: reason"; exit 0 / 1;
 *       -o writes the compiled form (sieve/sieve_bc.h) to file.bc
 *   sievec --run [options] script message
 *       execute for one recipient and print the actions, one per line, in
 *       the text form of sieve_actions_format(); a runtime error adds a
 *       last line "error: line N: reason" (the actions are then the
 *       implicit keep) and exits 3.
 *
 * Run options: -f sender (envelope from, "" for <>), -t recipient
 * (repeatable; envelope to), -m mailbox (repeatable; mailboxexists
 * answers yes), -D id (repeatable; duplicate answers yes), -E name=value
 * (environment item), -I dir (include: dir/NAME.sieve for :personal,
 * dir/global/NAME.sieve for :global), -N epoch (current date), -Z +hhmm
 * (local zone), -x ext,... (the allowed extensions; default all),
 * -b file.bc (run the stored compiled form of the script instead of
 * compiling it; a stale or damaged file is an error, exit 5).
 * Exit status: 0 ok, 1 compile error, 2 usage or I/O error, 3 runtime
 * error, 4 temporary failure, 5 the -b file was rejected.  Nothing is
 * delivered or sent.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/strarray.h"
#include "sieve/sieve.h"
#include "sieve/sieve_bc.h"
#include "sieve/sieve_msg.h"
#include "store/sievedir.h"

#define SIEVEC_OK 0
#define SIEVEC_COMPILE 1
#define SIEVEC_USAGE 2
#define SIEVEC_RUNTIME 3
#define SIEVEC_TEMP 4
#define SIEVEC_BADBC 5

static const char *sievec_progname = "sievec";

static void sievec_usage(FILE *out)
{
    fprintf(out,
"usage: %s [-x ext,...] [-o file.bc] script\n"
"       %s --run [-f sender] [-t rcpt]... [-m mailbox]... [-D id]...\n"
"              [-E name=value]... [-I dir] [-N epoch] [-Z +hhmm]\n"
"              [-x ext,...] [-o file.bc | -b file.bc] script message\n"
"Check a Sieve script (prints OK or \"line N: reason\"), or run it\n"
"against a message and print the actions it would take.\n"
"  -o file.bc  write the compiled form of the script\n"
"  -b file.bc  run the compiled form instead of compiling the script\n"
"  -h, --help  this text\n", sievec_progname, sievec_progname);
}

/* path into out; st_r (NULL: not wanted) its fstat() */
static int sievec_read(const char *path, struct buf *out, struct stat *st_r)
{
    FILE *f = fopen(path, "rb");
    char tmp[65536];
    size_t n;

    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", sievec_progname, path,
                strerror(errno));
        return -1;
    }
    if (st_r && fstat(fileno(f), st_r) != 0)
        memset(st_r, 0, sizeof(*st_r));
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        if (buf_append(out, tmp, n) < 0) {
            fprintf(stderr, "%s: %s: too large\n", sievec_progname, path);
            fclose(f);
            return -1;
        }
    if (ferror(f)) {
        fprintf(stderr, "%s: %s: read error\n", sievec_progname, path);
        fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

/* The compiled form of script (text) into path: a temporary file beside
 * it, fsync, rename.  0 or -1 (message printed). */
static int sievec_write_bc(const char *path, const struct sieve_script *s,
                           const struct buf *text, const struct stat *src,
                           const struct strarray *allowed)
{
    struct buf bc = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    int fd = -1, rc = -1;

    if (sieve_bc_encode(s, text->s, text->len, allowed, &bc) != SIEVE_OK ||
        buf_printf(&tmp, "%s.%ld.tmp", path, (long)getpid()) < 0) {
        fprintf(stderr, "%s: %s: out of memory\n", sievec_progname, path);
        goto out;
    }
    /* the script file it was compiled from is its source (a loader
     * that finds that file unchanged need not read it) */
    if (src && S_ISREG(src->st_mode))
        sievedir_bc_set_source(bc.s, bc.len, src);
    fd = open(buf_cstring(&tmp), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
              0640);
    if (fd < 0 || fs_write_all(fd, bc.s, bc.len) != 0 || fsync(fd) != 0 ||
        close(fd) != 0 || rename(buf_cstring(&tmp), path) != 0) {
        fprintf(stderr, "%s: %s: %s\n", sievec_progname, path,
                strerror(errno));
        if (fd >= 0)
            unlink(buf_cstring(&tmp));
        goto out;
    }
    rc = 0;
out:
    buf_free(&bc);
    buf_free(&tmp);
    return rc;
}

/* include: scripts compiled on demand, kept for the run */
struct sievec_inc {
    const char *dir;
    const struct strarray *allowed;
    struct strarray names;
    struct sieve_script **scripts;
    size_t n;
};

static struct sievec_inc sievec_inc;

static int sievec_include(void *rock, int global, const char *name,
                          const struct sieve_script **script_r,
                          struct buf *errmsg)
{
    struct sievec_inc *inc = &sievec_inc;
    struct buf path = BUF_INITIALIZER, text = BUF_INITIALIZER,
               key = BUF_INITIALIZER, err = BUF_INITIALIZER;
    struct sieve_script *s = NULL, **nv;
    long i;
    int rc;

    (void)rock;
    if (!inc->dir)
        return 0;
    buf_printf(&key, "%c:%s", global ? 'g' : 'p', name);
    i = strarray_find(&inc->names, buf_cstring(&key));
    if (i >= 0) {
        *script_r = inc->scripts[i];
        buf_free(&key);
        return 1;
    }
    buf_printf(&path, "%s/%s%s.sieve", inc->dir, global ? "global/" : "",
               name);
    {
        FILE *f = fopen(buf_cstring(&path), "rb");
        if (!f) {
            buf_free(&path);
            buf_free(&key);
            return 0;
        }
        fclose(f);
    }
    if (sievec_read(buf_cstring(&path), &text, NULL) < 0) {
        buf_free(&path);
        buf_free(&key);
        return -1;
    }
    rc = sieve_compile(text.s, text.len, NULL, inc->allowed, &s, &err);
    if (rc != SIEVE_OK) {
        buf_printf(errmsg, "%s", buf_cstring(&err));
        rc = 0;
        goto out;
    }
    nv = realloc(inc->scripts, (inc->n + 1) * sizeof(*nv));
    if (!nv || strarray_append(&inc->names, buf_cstring(&key)) < 0) {
        if (nv)
            inc->scripts = nv;
        sieve_script_free(&s);
        rc = -1;
        goto out;
    }
    inc->scripts = nv;
    inc->scripts[inc->n++] = s;
    *script_r = s;
    rc = 1;
out:
    buf_free(&path);
    buf_free(&text);
    buf_free(&key);
    buf_free(&err);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "run", no_argument, NULL, 'r' },
        { NULL, 0, NULL, 0 }
    };
    struct buf text = BUF_INITIALIZER, msgbytes = BUF_INITIALIZER,
               err = BUF_INITIALIZER, out = BUF_INITIALIZER;
    struct strarray allowed = STRARRAY_INITIALIZER;
    struct stat textst;
    int have_allowed = 0, run = 0, c, rc, status = SIEVEC_OK;
    struct sieve_script *script = NULL;
    struct sieve_msg m;
    struct sieve_message_ctx ctx;
    struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
    const char *from = NULL, *incdir = NULL, *bcout = NULL, *bcin = NULL;
    struct strarray to = STRARRAY_INITIALIZER, mboxes = STRARRAY_INITIALIZER,
                    dups = STRARRAY_INITIALIZER, envs = STRARRAY_INITIALIZER;
    long long now = 0;
    int zone = 0;
    size_t i;

    while ((c = getopt_long(argc, argv, "hf:t:m:D:E:I:N:Z:x:o:b:", longopts,
                            NULL)) != -1) {
        switch (c) {
        case 'h':
            sievec_usage(stdout);
            return SIEVEC_OK;
        case 'r': run = 1; break;
        case 'f': from = optarg; break;
        case 't': strarray_append(&to, optarg); break;
        case 'm': strarray_append(&mboxes, optarg); break;
        case 'D': strarray_append(&dups, optarg); break;
        case 'E': strarray_append(&envs, optarg); break;
        case 'I': incdir = optarg; break;
        case 'o': bcout = optarg; break;
        case 'b': bcin = optarg; break;
        case 'N': now = strtoll(optarg, NULL, 10); break;
        case 'Z':
            if (strlen(optarg) != 5 || (optarg[0] != '+' && optarg[0] != '-')) {
                fprintf(stderr, "%s: bad zone for -Z (try --help)\n",
                        sievec_progname);
                return SIEVEC_USAGE;
            }
            zone = ((optarg[1] - '0') * 10 + (optarg[2] - '0')) * 60 +
                   (optarg[3] - '0') * 10 + (optarg[4] - '0');
            if (optarg[0] == '-')
                zone = -zone;
            break;
        case 'x':
            have_allowed = 1;
            strarray_split(&allowed, optarg, ", ");
            break;
        default:
            fprintf(stderr, "%s: unknown option (try --help)\n",
                    sievec_progname);
            return SIEVEC_USAGE;
        }
    }
    if (argc - optind != (run ? 2 : 1)) {
        sievec_usage(stderr);
        return SIEVEC_USAGE;
    }
    if ((bcin && (!run || bcout))) {
        sievec_usage(stderr);
        return SIEVEC_USAGE;
    }
    if (sievec_read(argv[optind], &text, &textst) < 0)
        return SIEVEC_USAGE;
    if (bcin) {
        struct buf bc = BUF_INITIALIZER;
        const char *why = NULL;

        if (sievec_read(bcin, &bc, NULL) < 0)
            return SIEVEC_USAGE;
        rc = sieve_bc_decode(bc.s, bc.len, text.s, text.len, NULL,
                             have_allowed ? &allowed : NULL, &script, &why);
        buf_free(&bc);
        if (rc != SIEVE_OK) {
            fprintf(stderr, "%s: %s: compiled form rejected: %s\n",
                    sievec_progname, bcin, why ? why : sieve_strerror(rc));
            status = SIEVEC_BADBC;
            goto done;
        }
    } else {
        rc = sieve_compile(text.s, text.len, NULL,
                           have_allowed ? &allowed : NULL, &script, &err);
        if (rc != SIEVE_OK) {
            printf("%s\n", err.len ? buf_cstring(&err) : sieve_strerror(rc));
            status = SIEVEC_COMPILE;
            goto done;
        }
    }
    if (bcout && sievec_write_bc(bcout, script, &text, &textst,
                                 have_allowed ? &allowed : NULL) < 0) {
        status = SIEVEC_USAGE;
        goto done;
    }
    if (!run) {
        printf("OK\n");
        goto done;
    }
    if (sievec_read(argv[optind + 1], &msgbytes, NULL) < 0) {
        status = SIEVEC_USAGE;
        goto done;
    }
    sieve_msg_init(&m, msgbytes.s ? msgbytes.s : "", msgbytes.len);
    m.env_from = from;
    for (i = 0; i < to.count; i++)
        strarray_append(&m.env_to, to.data[i]);
    for (i = 0; i < mboxes.count; i++)
        strarray_append(&m.mailboxes, mboxes.data[i]);
    for (i = 0; i < dups.count; i++)
        strarray_append(&m.duplicates, dups.data[i]);
    for (i = 0; i < envs.count; i++)
        strarray_append(&m.environment, envs.data[i]);
    m.now = (time_t)now;
    m.zone_minutes = zone;
    sieve_msg_ctx(&m, &ctx);
    sievec_inc.dir = incdir;
    sievec_inc.allowed = have_allowed ? &allowed : NULL;
    ctx.include = sievec_include;
    rc = sieve_execute(script, &ctx, &acts, &err);
    sieve_actions_format(&acts, &out);
    fputs(buf_cstring(&out), stdout);
    if (rc == SIEVE_ERUNTIME) {
        printf("error: %s\n", buf_cstring(&err));
        status = SIEVEC_RUNTIME;
    } else if (rc != SIEVE_OK) {
        printf("error: %s: %s\n", sieve_strerror(rc), buf_cstring(&err));
        status = rc == SIEVE_ETEMP ? SIEVEC_TEMP : SIEVEC_USAGE;
    }
    sieve_actions_fini(&acts);
    sieve_msg_fini(&m);
    for (i = 0; i < sievec_inc.n; i++)
        sieve_script_free(&sievec_inc.scripts[i]);
    free(sievec_inc.scripts);
    strarray_fini(&sievec_inc.names);
done:
    sieve_script_free(&script);
    buf_free(&text);
    buf_free(&msgbytes);
    buf_free(&err);
    buf_free(&out);
    strarray_fini(&allowed);
    strarray_fini(&to);
    strarray_fini(&mboxes);
    strarray_fini(&dups);
    strarray_fini(&envs);
    return status;
}

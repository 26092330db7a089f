/*
 * sieve_match.c - comparators (RFC 4790: i;octet, i;ascii-casemap,
 * i;ascii-numeric) and match types (:is, :contains, :matches, :regex,
 * relational :value).
 *
 * Every match is bounded.  :matches uses the two-cursor glob algorithm
 * that only ever backtracks to the most recent '*': its cost is at most
 * (pattern length + 1) x (value length + 1) steps, never exponential,
 * and each wildcard's capture is the shortest one that lets the rest
 * match, as RFC 5229 3.2 asks.  :contains is a bounded scan.  :regex
 * runs POSIX regexec() on keys checked by sieve_regex_refusal() (no
 * back-references, the one feature that makes POSIX matching
 * exponential; a bounded size once repetitions are expanded, as the
 * compiled form's memory grows with its square) and on values no longer
 * than max_match_len; a call costs (value length + 1) x (positions of
 * the expanded key) steps, as regexec() walks the value once per
 * position.  Each call adds its cost to *steps, and passing
 * max_steps ends the match with an error.
 */
#include "config.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sieve/sieve_tree.h"

static int fold(int c, int casemap)
{
    if (casemap && c >= 'A' && c <= 'Z')
        return c + ('a' - 'A');
    return c;
}

/* bytes of the UTF-8 character starting at s[0] (at least 1) */
static size_t utf8_len(const char *s, size_t left)
{
    unsigned char c = (unsigned char)s[0];
    size_t n = 1;

    if (c >= 0xc0) {
        while (n < left && n < 4 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n++;
    }
    return n;
}

int sieve_glob(const char *p, size_t plen, const char *s, size_t slen,
               int casemap, struct strarray *caps, unsigned long *steps,
               unsigned long max_steps)
{
    /* per wildcard: start and length in s */
    size_t nwild = 0, i;
    size_t *cs = NULL, *cl = NULL, *wno = NULL;
    size_t pi = 0, si = 0, star_p = (size_t)-1, star_s = 0;
    int result = 0;

    wno = calloc(plen + 1, sizeof(*wno));
    if (!wno)
        return -1;
    for (i = 0; i < plen; i++) {
        if (p[i] == '\\' && i + 1 < plen) {
            i++;
            continue;
        }
        if (p[i] == '*' || p[i] == '?')
            wno[i] = nwild++;
    }
    if (caps) {
        cs = calloc(nwild + 1, sizeof(*cs));
        cl = calloc(nwild + 1, sizeof(*cl));
        if (!cs || !cl) {
            free(wno);
            free(cs);
            free(cl);
            return -1;
        }
    }
    for (;;) {
        if (steps && ++*steps > max_steps) {
            result = -2;
            break;
        }
        if (pi < plen) {
            char pc = p[pi];
            if (pc == '*') {
                star_p = pi;
                star_s = si;
                if (cs) {
                    cs[wno[pi]] = si;
                    cl[wno[pi]] = 0;
                }
                pi++;
                continue;
            }
            if (si < slen) {
                if (pc == '?') {
                    size_t n = casemap ? utf8_len(s + si, slen - si) : 1;
                    if (cs) {
                        cs[wno[pi]] = si;
                        cl[wno[pi]] = n;
                    }
                    pi++;
                    si += n;
                    continue;
                }
                if (pc == '\\' && pi + 1 < plen)
                    pc = p[++pi];
                if (fold((unsigned char)pc, casemap) ==
                    fold((unsigned char)s[si], casemap)) {
                    pi++;
                    si++;
                    continue;
                }
            }
        } else if (si == slen) {
            result = 1;
            break;
        }
        /* mismatch: let the last star take one more character */
        if (star_p == (size_t)-1 || star_s >= slen) {
            result = 0;
            break;
        }
        star_s += casemap ? utf8_len(s + star_s, slen - star_s) : 1;
        si = star_s;
        pi = star_p + 1;
        if (cs)
            cl[wno[star_p]] = star_s - cs[wno[star_p]];
    }
    if (result == 1 && caps) {
        strarray_fini(caps);
        if (strarray_append(caps, "") < 0) {  /* ${0}: set by the caller */
            result = -1;
        } else {
            for (i = 0; i < nwild && i < 9; i++) {
                char *v = strndup(s + cs[i], cl[i]);
                if (strarray_appendm(caps, v) < 0) {
                    result = -1;
                    break;
                }
            }
        }
    }
    free(wno);
    free(cs);
    free(cl);
    return result;
}

/* the digit run at the start of s (leading zeros skipped); *inf set when
 * there is no leading digit (positive infinity, RFC 4790 9.1) */
static void numeric_prefix(const char *s, size_t len, const char **d,
                           size_t *dlen, int *inf)
{
    size_t i = 0, z;

    while (i < len && isdigit((unsigned char)s[i]))
        i++;
    *inf = i == 0;
    z = 0;
    while (z + 1 < i && s[z] == '0')
        z++;
    *d = s + z;
    *dlen = i - z;
}

int sieve_cmp_order(int comparator, const char *a, size_t alen,
                    const char *b, size_t blen)
{
    size_t i, n;

    if (comparator == SV_CMP_NUMERIC) {
        const char *da, *db;
        size_t la, lb;
        int ia, ib, c;
        numeric_prefix(a, alen, &da, &la, &ia);
        numeric_prefix(b, blen, &db, &lb, &ib);
        if (ia || ib)
            return ia - ib;
        if (la != lb)
            return la < lb ? -1 : 1;
        c = memcmp(da, db, la);
        return c < 0 ? -1 : c > 0;
    }
    n = alen < blen ? alen : blen;
    for (i = 0; i < n; i++) {
        int x = fold((unsigned char)a[i], comparator == SV_CMP_CASEMAP);
        int y = fold((unsigned char)b[i], comparator == SV_CMP_CASEMAP);
        if (x != y)
            return x < y ? -1 : 1;
    }
    return alen == blen ? 0 : alen < blen ? -1 : 1;
}

int sieve_relop_holds(int relop, int c)
{
    switch (relop) {
    case SV_REL_GT: return c > 0;
    case SV_REL_GE: return c >= 0;
    case SV_REL_LT: return c < 0;
    case SV_REL_LE: return c <= 0;
    case SV_REL_EQ: return c == 0;
    default: return c != 0;
    }
}

/* Counts stop growing here (a key's positions are far below it when
 * accepted; the square of it still fits in 64 bits). */
#define RX_SATURATE ((uint64_t)1 << 30)

/* The end of the bracket expression opening at p[i] ('['): the index
 * after its ']' (len when it has none; regcomp() refuses it then). */
static size_t regex_bracket_end(const char *p, size_t len, size_t i)
{
    size_t j = i + 1;

    if (j < len && p[j] == '^')
        j++;
    if (j < len && p[j] == ']')
        j++;                    /* a ']' first is a member */
    while (j < len && p[j] != ']') {
        if (p[j] == '[' && j + 1 < len &&
            (p[j + 1] == ':' || p[j + 1] == '.' || p[j + 1] == '=')) {
            char d = p[j + 1];

            for (j += 2; j + 1 < len && !(p[j] == d && p[j + 1] == ']');
                 j++)
                ;
            j += 2;
        } else {
            j++;
        }
    }
    return j < len ? j + 1 : len;
}

/* An interval {N}, {N,}, {N,M} or {,M} at p[i]: the index after its '}'
 * and the copies of the atom before it that regcomp() makes (M, or N+1
 * for an open one); 0 when it is not an interval (its '{' is a literal
 * then, or an error regcomp() reports). */
static size_t regex_interval(const char *p, size_t len, size_t i,
                             uint64_t *copies_r)
{
    uint64_t lo = 0, hi = 0;
    size_t j = i + 1;
    int has_lo = 0, has_comma = 0, has_hi = 0;

    for (; j < len && p[j] >= '0' && p[j] <= '9'; j++, has_lo = 1)
        if (lo < RX_SATURATE)
            lo = lo * 10 + (uint64_t)(p[j] - '0');
    if (j < len && p[j] == ',') {
        has_comma = 1;
        for (j++; j < len && p[j] >= '0' && p[j] <= '9'; j++, has_hi = 1)
            if (hi < RX_SATURATE)
                hi = hi * 10 + (uint64_t)(p[j] - '0');
    }
    if (j >= len || p[j] != '}' || (!has_lo && !has_hi))
        return 0;
    if (!has_comma)
        *copies_r = lo;
    else if (!has_hi)
        *copies_r = lo + 1;
    else
        *copies_r = hi > lo ? hi : lo;
    if (*copies_r == 0)
        *copies_r = 1;
    return j + 1;
}

static uint64_t regex_sat(uint64_t v)
{
    return v > RX_SATURATE ? RX_SATURATE : v;
}

/* *size_r: the positions of the ERE p once its repetitions are
 * expanded; returns NULL, or why regcomp() may not have p at all. */
static const char *regex_size(const char *p, size_t len, uint64_t *size_r)
{
    /* per open group: the positions in it so far, and those of the last
     * atom (what a repetition copies; 0: nothing to repeat) */
    struct {
        uint64_t sum, last;
    } f[SIEVE_REGEX_MAX_DEPTH + 1];
    unsigned d = 0;
    uint64_t n, copies;
    size_t i = 0, j;

    f[0].sum = f[0].last = 0;
    *size_r = 0;
#define RX_ATOM(k) (f[d].last = (k), f[d].sum = regex_sat(f[d].sum + (k)))
    while (i < len) {
        copies = 0;
        switch (p[i]) {
        case '\\':
            if (i + 1 < len && p[i + 1] >= '1' && p[i + 1] <= '9')
                return "back-references are not allowed";
            RX_ATOM(1);
            i += 2;
            continue;
        case '[':
            RX_ATOM(1);
            i = regex_bracket_end(p, len, i);
            continue;
        case '(':
            if (d == SIEVE_REGEX_MAX_DEPTH)
                return "groups nested too deep";
            d++;
            f[d].sum = f[d].last = 0;
            i++;
            continue;
        case ')':
            if (d == 0) {
                RX_ATOM(1);
            } else {
                n = f[d].sum + 1;
                d--;
                RX_ATOM(n);
            }
            i++;
            continue;
        case '|':
            f[d].last = 0;
            f[d].sum = regex_sat(f[d].sum + 1);
            i++;
            continue;
        case '*':
        case '?':
            copies = 1;
            j = i + 1;
            break;
        case '+':
            copies = 2;             /* x+ is x x* */
            j = i + 1;
            break;
        case '{':
            j = regex_interval(p, len, i, &copies);
            break;
        default:
            break;
        }
        if (!copies || !f[d].last) {
            /* a literal (or a repetition of nothing: regcomp's error) */
            RX_ATOM(1);
            i++;
            continue;
        }
        n = regex_sat(f[d].last * copies + 1);
        f[d].sum = regex_sat(f[d].sum - f[d].last + n);
        f[d].last = n;
        i = j;
    }
    while (d > 0) {                 /* unclosed: regcomp() refuses it */
        n = f[d].sum + 1;
        d--;
        RX_ATOM(n);
    }
#undef RX_ATOM
    *size_r = f[0].sum;
    return NULL;
}

const char *sieve_regex_refusal(const char *p, size_t len,
                                unsigned long max_cost,
                                unsigned long *cost_r)
{
    uint64_t size, cost;
    const char *why = regex_size(p, len, &size);

    cost = size * size;         /* size <= 2^30 */
    if (cost_r)
        *cost_r = cost > ULONG_MAX ? ULONG_MAX : (unsigned long)cost;
    if (!why && cost > max_cost)
        why = "too large once its repetitions are expanded";
    return why;
}

/* :contains.  Every start position is charged klen steps, as a
 * byte-by-byte comparison at each would cost; the positions whose first
 * byte cannot start the key are passed over in one tight loop and charged
 * together (the same total, the same position where the budget runs
 * out: no match can lie among them). */
static int contains(struct sv_matchctx *mc, int casemap, const char *v,
                    size_t vlen, const char *k, size_t klen)
{
    size_t i, i0, j, last;
    int f0;

    if (klen == 0)
        return 1;
    if (klen > vlen)
        return 0;
    last = vlen - klen;
    f0 = fold((unsigned char)k[0], casemap);
    for (i = 0; i <= last; i++) {
        i0 = i;
        while (i <= last && fold((unsigned char)v[i], casemap) != f0)
            i++;
        *mc->steps += klen * (i - i0 + (i <= last));
        if (*mc->steps > mc->max_steps) {
            mc->error = 1;
            return -1;
        }
        if (i > last)
            return 0;
        for (j = 1; j < klen; j++)
            if (fold((unsigned char)v[i + j], casemap) !=
                fold((unsigned char)k[j], casemap))
                break;
        if (j == klen)
            return 1;
    }
    return 0;
}

int sieve_match(struct sv_matchctx *mc, int comparator, int match, int relop,
                const char *val, size_t vlen, const char *key, size_t klen,
                const regex_t *re)
{
    int casemap = comparator == SV_CMP_CASEMAP;

    switch (match) {
    case SV_MATCH_IS:
        return sieve_cmp_order(comparator, val, vlen, key, klen) == 0;
    case SV_MATCH_VALUE:
        return sieve_relop_holds(relop,
                                 sieve_cmp_order(comparator, val, vlen, key,
                                                 klen));
    case SV_MATCH_CONTAINS:
        return contains(mc, casemap, val, vlen, key, klen);
    case SV_MATCH_MATCHES: {
        struct strarray caps = STRARRAY_INITIALIZER;
        int r;
        if (vlen > mc->max_len)
            vlen = mc->max_len;
        r = sieve_glob(key, klen, val, vlen, casemap,
                       mc->vars ? &caps : NULL, mc->steps, mc->max_steps);
        if (r == -2) {
            mc->error = 1;
            strarray_fini(&caps);
            return -1;
        }
        if (r < 0) {
            strarray_fini(&caps);
            return -1;
        }
        if (r == 1 && mc->vars) {
            free(caps.data[0]);
            caps.data[0] = strndup(val, vlen);
            if (!caps.data[0]) {
                caps.data[0] = strdup("");
            }
            strarray_fini(mc->vars);
            *mc->vars = caps;
        } else {
            strarray_fini(&caps);
        }
        return r;
    }
    case SV_MATCH_REGEX: {
        regmatch_t pm[10];
        size_t i;
        if (vlen > mc->max_len) {
            mc->error = 2;
            return -1;
        }
        {
            /* regexec() walks the value once per position of the
             * expanded key (and keeps a set of positions per byte):
             * (^(a|b)*a(a|b){200}$ took 16 s and 1.6 GB for a 64 KiB
             * value) */
            uint64_t size = 1, cost;

            (void)regex_size(key, klen, &size);
            cost = ((uint64_t)vlen + 1) * (size ? size : 1);
            if (*mc->steps > mc->max_steps ||
                cost > mc->max_steps - *mc->steps) {
                mc->error = 1;
                return -1;
            }
            *mc->steps += (unsigned long)cost;
        }
        if (!re) {
            mc->error = 3;
            return -1;
        }
        if (regexec(re, val, 10, pm, 0) != 0)
            return 0;
        if (mc->vars) {
            strarray_fini(mc->vars);
            for (i = 0; i < 10; i++) {
                char *v;
                if (pm[i].rm_so < 0)
                    v = strdup("");
                else
                    v = strndup(val + pm[i].rm_so,
                                (size_t)(pm[i].rm_eo - pm[i].rm_so));
                if (strarray_appendm(mc->vars, v) < 0)
                    return -1;
            }
        }
        return 1;
    }
    default:
        return 0;
    }
}

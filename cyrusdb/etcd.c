/*
 * etcd.c - a small client for etcd's v3 JSON gateway.  See etcd.h.
 *
 * The gateway's JSON is protobuf's: int64 fields come as strings
 * ("revision": "12"), fields with their default value (an empty value,
 * "more": false, "succeeded": false) are left out, bytes are base64.  An
 * answer without a "header" object is not etcd's and counts as
 * ETCD_UNAVAILABLE, as does any HTTP status but 200.
 */
#include "config.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cyrusdb/etcd.h"
#include "lib/buf.h"
#include "lib/log.h"

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_MAX_ANSWER ((size_t)256 << 20)   /* 256 MiB */

struct etcd_client {
    CURL *curl;
    struct curl_slist *headers;
    char *endpoints[ETCD_MAX_ENDPOINTS];
    size_t nendpoints;
    size_t current;             /* the endpoint that answered last */
    long timeout_ms;
    struct buf answer;
    char curlerr[CURL_ERROR_SIZE];
};

/* One log line per burst of failures (per process): the first failure is
 * logged, later ones are counted until a request succeeds again, which is
 * logged with the count. */
static unsigned long etcd_failures;

static void etcd_failed(const char *endpoint, const char *path,
                        const char *why)
{
    if (etcd_failures++ == 0)
        log_error("etcd: request failed endpoint=<%s> request=<%s> "
                  "error=<%s> (further failures are counted, not logged, "
                  "until etcd answers again)", endpoint, path, why);
}

static void etcd_succeeded(const char *endpoint)
{
    if (etcd_failures) {
        log_info("etcd: answering again endpoint=<%s> failed_requests=<%lu>",
                 endpoint, etcd_failures);
        etcd_failures = 0;
    }
}

/* ---- base64 ------------------------------------------------------------ */

static const char etcd_b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *etcd_b64_encode(const char *in, size_t len)
{
    const unsigned char *p = (const unsigned char *)in;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    size_t i;

    if (!out)
        return NULL;
    for (i = 0; i + 2 < len; i += 3) {
        *o++ = etcd_b64[p[i] >> 2];
        *o++ = etcd_b64[((p[i] & 3) << 4) | (p[i + 1] >> 4)];
        *o++ = etcd_b64[((p[i + 1] & 15) << 2) | (p[i + 2] >> 6)];
        *o++ = etcd_b64[p[i + 2] & 63];
    }
    if (i < len) {
        *o++ = etcd_b64[p[i] >> 2];
        if (i + 1 < len) {
            *o++ = etcd_b64[((p[i] & 3) << 4) | (p[i + 1] >> 4)];
            *o++ = etcd_b64[(p[i + 1] & 15) << 2];
        } else {
            *o++ = etcd_b64[(p[i] & 3) << 4];
            *o++ = '=';
        }
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int etcd_b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* Decode into a malloc'ed, NUL-terminated buffer; -1 on bad input. */
static int etcd_b64_decode(const char *in, size_t len, char **out_r,
                           size_t *outlen_r)
{
    char *out = malloc(len / 4 * 3 + 4);
    size_t i, o = 0;
    unsigned acc = 0;
    int bits = 0;

    if (!out)
        return -1;
    while (len > 0 && in[len - 1] == '=')
        len--;
    for (i = 0; i < len; i++) {
        int v = etcd_b64_value((unsigned char)in[i]);
        if (v < 0) {
            free(out);
            return -1;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = '\0';
    *out_r = out;
    *outlen_r = o;
    return 0;
}

/* ---- client ------------------------------------------------------------ */

int etcd_client_new(const struct etcd_settings *s, struct etcd_client **c_r,
                    const char **error_r)
{
    static int curl_ready;
    struct etcd_client *c;
    const char *p = s->endpoints ? s->endpoints : "";

    *c_r = NULL;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            *error_r = "libcurl initialisation failed";
            return -1;
        }
        curl_ready = 1;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        *error_r = "out of memory";
        return -1;
    }
    while (*p) {
        size_t n = strcspn(p, ", \t");
        if (n > 0) {
            if (c->nendpoints == ETCD_MAX_ENDPOINTS) {
                *error_r = "too many etcd_endpoints (at most 16)";
                goto fail;
            }
            if (strncmp(p, "http://", 7) && strncmp(p, "https://", 8)) {
                *error_r = "etcd_endpoints: each must start with http:// or https://";
                goto fail;
            }
            c->endpoints[c->nendpoints] = strndup(p, n);
            if (!c->endpoints[c->nendpoints]) {
                *error_r = "out of memory";
                goto fail;
            }
            /* "http://h:p/" and "http://h:p" are the same endpoint */
            while (n > 8 && c->endpoints[c->nendpoints][n - 1] == '/')
                c->endpoints[c->nendpoints][--n] = '\0';
            c->nendpoints++;
        }
        p += n;
        p += strspn(p, ", \t");
    }
    if (c->nendpoints == 0) {
        *error_r = "etcd_endpoints is empty";
        goto fail;
    }
    c->timeout_ms = s->timeout_ms > 0 ? s->timeout_ms : 5000;
    c->curl = curl_easy_init();
    c->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!c->curl || !c->headers) {
        *error_r = "libcurl handle creation failed";
        goto fail;
    }
    curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(c->curl, CURLOPT_ERRORBUFFER, c->curlerr);
    curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    if (s->cacert && *s->cacert)
        curl_easy_setopt(c->curl, CURLOPT_CAINFO, s->cacert);
    if (s->cert && *s->cert)
        curl_easy_setopt(c->curl, CURLOPT_SSLCERT, s->cert);
    if (s->key && *s->key)
        curl_easy_setopt(c->curl, CURLOPT_SSLKEY, s->key);
    buf_set_max(&c->answer, ETCD_MAX_ANSWER);
    *c_r = c;
    return 0;

fail:
    etcd_client_free(&c);
    return -1;
}

void etcd_client_free(struct etcd_client **cp)
{
    struct etcd_client *c = *cp;
    size_t i;

    if (!c)
        return;
    *cp = NULL;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->headers);
    for (i = 0; i < c->nendpoints; i++)
        free(c->endpoints[i]);
    buf_free(&c->answer);
    free(c);
}

static size_t etcd_write_cb(char *data, size_t size, size_t nmemb, void *rock)
{
    struct buf *b = rock;

    if (buf_append(b, data, size * nmemb) < 0)
        return 0;   /* too large: curl fails the transfer */
    return size * nmemb;
}

/* POST body to path; on ETCD_OK *answer_r is the parsed JSON object with
 * a "header" object (caller decrefs). */
static int etcd_call(struct etcd_client *c, const char *path, json_t *body,
                     int is_read, json_t **answer_r)
{
    char *text = json_dumps(body, JSON_COMPACT);
    int r = ETCD_UNAVAILABLE;
    size_t attempt;
    char why[512];

    *answer_r = NULL;
    if (!text)
        return ETCD_NOMEM;
    for (attempt = 0; attempt < c->nendpoints; attempt++) {
        const char *ep = c->endpoints[c->current];
        char url[1024];
        long status = 0;
        CURLcode cr;
        json_t *j;
        json_error_t jerr;
        int next = 0;

        snprintf(url, sizeof(url), "%s%s", ep, path);
        buf_reset(&c->answer);
        c->curlerr[0] = '\0';
        curl_easy_setopt(c->curl, CURLOPT_URL, url);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, text);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, etcd_write_cb);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &c->answer);
        cr = curl_easy_perform(c->curl);
        if (cr != CURLE_OK) {
            snprintf(why, sizeof(why), "%s", c->curlerr[0] ? c->curlerr
                                                           : curl_easy_strerror(cr));
            /* not sent at all: any request may go elsewhere */
            next = cr == CURLE_COULDNT_CONNECT || cr == CURLE_COULDNT_RESOLVE_HOST
                   || (is_read && cr != CURLE_WRITE_ERROR);
            r = ETCD_UNAVAILABLE;
            goto failed;
        }
        curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
        j = json_loadb(c->answer.s ? c->answer.s : "", c->answer.len, 0, &jerr);
        if (status != 200) {
            const char *msg = NULL;
            if (j && json_is_object(j)) {
                msg = json_string_value(json_object_get(j, "message"));
                if (!msg)
                    msg = json_string_value(json_object_get(j, "error"));
            }
            snprintf(why, sizeof(why), "HTTP status %ld: %s", status,
                     msg ? msg : "(no etcd error message)");
            if (msg && strstr(msg, "compacted")) {
                json_decref(j);
                free(text);
                return ETCD_COMPACTED;
            }
            if (status >= 400 && status < 500 && msg) {
                log_error("etcd: request refused endpoint=<%s> request=<%s> "
                          "error=<%s>", ep, path, why);
                json_decref(j);
                free(text);
                return ETCD_REFUSED;
            }
            json_decref(j);
            next = is_read;
            r = ETCD_UNAVAILABLE;
            goto failed;
        }
        if (!j || !json_is_object(j) ||
            !json_is_object(json_object_get(j, "header"))) {
            snprintf(why, sizeof(why), "answer is not etcd's JSON%s%s",
                     j ? "" : ": ", j ? "" : jerr.text);
            json_decref(j);
            next = is_read;
            r = ETCD_UNAVAILABLE;
            goto failed;
        }
        etcd_succeeded(ep);
        free(text);
        *answer_r = j;
        return ETCD_OK;

    failed:
        etcd_failed(ep, path, why);
        if (!next)
            break;
        c->current = (c->current + 1) % c->nendpoints;
    }
    free(text);
    return r;
}

/* ---- JSON helpers ------------------------------------------------------ */

static int etcd_set_bytes(json_t *obj, const char *name, const char *s,
                          size_t len)
{
    char *b = etcd_b64_encode(s, len);
    int r;

    if (!b)
        return -1;
    r = json_object_set_new(obj, name, json_string(b));
    free(b);
    return r;
}

static int etcd_set_int(json_t *obj, const char *name, int64_t v)
{
    char num[32];

    snprintf(num, sizeof(num), "%lld", (long long)v);
    return json_object_set_new(obj, name, json_string(num));
}

/* An int64 field: a string of digits or a JSON integer; absent = 0.
 * -1 when it is something else. */
static int etcd_get_int(json_t *obj, const char *name, int64_t *v_r)
{
    json_t *v = json_object_get(obj, name);
    char *end;
    long long n;

    *v_r = 0;
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        *v_r = (int64_t)json_integer_value(v);
        return 0;
    }
    if (!json_is_string(v) || !*json_string_value(v))
        return -1;
    n = strtoll(json_string_value(v), &end, 10);
    if (*end)
        return -1;
    *v_r = (int64_t)n;
    return 0;
}

/* A bytes field; absent = empty. */
static int etcd_get_bytes(json_t *obj, const char *name, char **s_r,
                          size_t *len_r)
{
    json_t *v = json_object_get(obj, name);

    if (!v)
        return etcd_b64_decode("", 0, s_r, len_r);
    if (!json_is_string(v))
        return -1;
    return etcd_b64_decode(json_string_value(v), json_string_length(v),
                           s_r, len_r);
}

/* ---- requests ---------------------------------------------------------- */

void etcd_prefix_end(const char *prefix, size_t len, char *out,
                     size_t *endlen_r)
{
    memcpy(out, prefix, len);
    while (len > 0) {
        if ((unsigned char)out[len - 1] != 0xff) {
            out[len - 1] = (char)((unsigned char)out[len - 1] + 1);
            break;
        }
        len--;
    }
    *endlen_r = len;
}

void etcd_range_free(struct etcd_range *r)
{
    size_t i;

    for (i = 0; i < r->n; i++) {
        free(r->kvs[i].key);
        free(r->kvs[i].value);
    }
    free(r->kvs);
    memset(r, 0, sizeof(*r));
}

/* Parse a range answer into out; -1 when it is not etcd's. */
static int etcd_range_parse(json_t *ans, struct etcd_range *out)
{
    json_t *kvs;
    size_t i;

    if (etcd_get_int(json_object_get(ans, "header"), "revision",
                     &out->revision) < 0 || out->revision <= 0)
        return -1;
    out->more = json_is_true(json_object_get(ans, "more"));
    kvs = json_object_get(ans, "kvs");
    if (kvs && !json_is_array(kvs))
        return -1;
    if (!kvs || json_array_size(kvs) == 0)
        return 0;
    out->kvs = calloc(json_array_size(kvs), sizeof(*out->kvs));
    if (!out->kvs)
        return -1;
    for (i = 0; i < json_array_size(kvs); i++) {
        json_t *kv = json_array_get(kvs, i);
        struct etcd_kv *o = &out->kvs[out->n];
        if (!json_is_object(kv) ||
            etcd_get_bytes(kv, "key", &o->key, &o->keylen) < 0)
            return -1;
        out->n++;
        if (etcd_get_bytes(kv, "value", &o->value, &o->valuelen) < 0 ||
            etcd_get_int(kv, "mod_revision", &o->mod_revision) < 0 ||
            etcd_get_int(kv, "create_revision", &o->create_revision) < 0 ||
            o->mod_revision <= 0 || o->keylen == 0)
            return -1;
    }
    return 0;
}

int etcd_range(struct etcd_client *c, const char *key, size_t keylen,
               const char *end, size_t endlen, long limit, int64_t revision,
               struct etcd_range *out)
{
    json_t *req = json_object(), *ans = NULL;
    int r = ETCD_NOMEM;
    size_t attempt;

    memset(out, 0, sizeof(*out));
    if (!req || etcd_set_bytes(req, "key", key, keylen) < 0 ||
        (endlen && etcd_set_bytes(req, "range_end", end, endlen) < 0) ||
        (limit && etcd_set_int(req, "limit", limit) < 0) ||
        (revision && etcd_set_int(req, "revision", revision) < 0))
        goto done;
    /* a read may go to the next member when an answer is malformed */
    for (attempt = 0; attempt < c->nendpoints; attempt++) {
        r = etcd_call(c, "/v3/kv/range", req, 1, &ans);
        if (r != ETCD_OK)
            break;
        if (etcd_range_parse(ans, out) == 0)
            break;
        etcd_range_free(out);
        json_decref(ans);
        ans = NULL;
        r = ETCD_UNAVAILABLE;
        etcd_failed(c->endpoints[c->current], "/v3/kv/range",
                    "answer is not etcd's JSON (bad range result)");
        c->current = (c->current + 1) % c->nendpoints;
    }
done:
    if (r != ETCD_OK)
        etcd_range_free(out);
    json_decref(req);
    json_decref(ans);
    return r;
}

static json_t *etcd_op_json(const struct etcd_op *op)
{
    json_t *inner = json_object(), *outer = json_object();

    if (!inner || !outer)
        goto fail;
    if (etcd_set_bytes(inner, "key", op->key, op->keylen) < 0)
        goto fail;
    if (!op->delete && etcd_set_bytes(inner, "value", op->value, op->valuelen) < 0)
        goto fail;
    if (json_object_set_new(outer, op->delete ? "request_delete_range"
                                              : "request_put", inner) < 0) {
        inner = NULL;
        goto fail;
    }
    return outer;

fail:
    json_decref(inner);
    json_decref(outer);
    return NULL;
}

static json_t *etcd_cmp_json(const struct etcd_cmp *cmp)
{
    json_t *j = json_object();
    int bad;

    if (!j)
        return NULL;
    bad = etcd_set_bytes(j, "key", cmp->key, cmp->keylen) < 0;
    switch (cmp->kind) {
    case ETCD_CMP_MOD_EQUAL:
        bad |= json_object_set_new(j, "target", json_string("MOD")) < 0;
        bad |= json_object_set_new(j, "result", json_string("EQUAL")) < 0;
        bad |= etcd_set_int(j, "mod_revision", cmp->rev) < 0;
        break;
    case ETCD_CMP_ABSENT:
        bad |= json_object_set_new(j, "target", json_string("CREATE")) < 0;
        bad |= json_object_set_new(j, "result", json_string("EQUAL")) < 0;
        bad |= etcd_set_int(j, "create_revision", 0) < 0;
        break;
    case ETCD_CMP_PRESENT:
        bad |= json_object_set_new(j, "target", json_string("CREATE")) < 0;
        bad |= json_object_set_new(j, "result", json_string("GREATER")) < 0;
        bad |= etcd_set_int(j, "create_revision", 0) < 0;
        break;
    case ETCD_CMP_RANGE_OLDER:
        bad |= etcd_set_bytes(j, "range_end", cmp->end, cmp->endlen) < 0;
        bad |= json_object_set_new(j, "target", json_string("MOD")) < 0;
        bad |= json_object_set_new(j, "result", json_string("LESS")) < 0;
        bad |= etcd_set_int(j, "mod_revision", cmp->rev + 1) < 0;
        break;
    }
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

int etcd_txn(struct etcd_client *c, const struct etcd_cmp *cmps, size_t ncmps,
             const struct etcd_op *ops, size_t nops, int *succeeded_r)
{
    json_t *req = json_object(), *compare = json_array(),
           *success = json_array(), *ans = NULL;
    int r = ETCD_NOMEM;
    size_t i;

    *succeeded_r = 0;
    if (!req || !compare || !success)
        goto done;
    for (i = 0; i < ncmps; i++)
        if (json_array_append_new(compare, etcd_cmp_json(&cmps[i])) < 0)
            goto done;
    for (i = 0; i < nops; i++)
        if (json_array_append_new(success, etcd_op_json(&ops[i])) < 0)
            goto done;
    if (json_object_set(req, "compare", compare) < 0 ||
        json_object_set(req, "success", success) < 0)
        goto done;
    r = etcd_call(c, "/v3/kv/txn", req, 0, &ans);
    if (r == ETCD_OK)
        *succeeded_r = json_is_true(json_object_get(ans, "succeeded"));
done:
    json_decref(compare);
    json_decref(success);
    json_decref(req);
    json_decref(ans);
    return r;
}

int etcd_put(struct etcd_client *c, const char *key, size_t keylen,
             const char *value, size_t valuelen)
{
    json_t *req = json_object(), *ans = NULL;
    int r = ETCD_NOMEM;

    if (req && etcd_set_bytes(req, "key", key, keylen) == 0 &&
        etcd_set_bytes(req, "value", value, valuelen) == 0)
        r = etcd_call(c, "/v3/kv/put", req, 0, &ans);
    json_decref(req);
    json_decref(ans);
    return r;
}

int etcd_delete(struct etcd_client *c, const char *key, size_t keylen,
                long *deleted_r)
{
    json_t *req = json_object(), *ans = NULL;
    int64_t n = 0;
    int r = ETCD_NOMEM;

    *deleted_r = 0;
    if (req && etcd_set_bytes(req, "key", key, keylen) == 0)
        r = etcd_call(c, "/v3/kv/deleterange", req, 0, &ans);
    if (r == ETCD_OK) {
        if (etcd_get_int(ans, "deleted", &n) < 0 || n < 0) {
            etcd_failed(c->endpoints[c->current], "/v3/kv/deleterange",
                        "answer is not etcd's JSON (bad deleted count)");
            r = ETCD_UNAVAILABLE;
        }
        *deleted_r = (long)n;
    }
    json_decref(req);
    json_decref(ans);
    return r;
}

/* ---- watch ------------------------------------------------------------- */

struct etcd_watch_state {
    etcd_watch_fn *cb;
    int (*stop)(void *rock);
    void *rock;
    struct buf pending;     /* bytes of an unfinished line */
    const char *why;        /* why the stream was given up */
    int stopped;
};

/* One line of the stream: {"result":{"header":...,"created":true,
 * "events":[{"type":"DELETE","kv":{"key":"..."}}],"canceled":true}}.
 * 0, or -1 (st->why set) to end the stream. */
static int etcd_watch_line(struct etcd_watch_state *st, const char *line,
                           size_t len)
{
    json_t *j, *res, *events, *ev;
    json_error_t jerr;
    size_t i;

    if (len == 0)
        return 0;
    j = json_loadb(line, len, 0, &jerr);
    res = j ? json_object_get(j, "result") : NULL;
    if (!res || !json_is_object(res) ||
        !json_is_object(json_object_get(res, "header"))) {
        st->why = "watch stream: an answer that is not etcd's";
        json_decref(j);
        return -1;
    }
    if (json_is_true(json_object_get(res, "canceled"))) {
        st->why = "watch canceled by etcd";
        json_decref(j);
        return -1;
    }
    if (json_is_true(json_object_get(res, "created")))
        st->cb(st->rock, ETCD_WATCH_CREATED, NULL, 0);
    events = json_object_get(res, "events");
    if (json_is_array(events)) {
        json_array_foreach(events, i, ev) {
            char *key = NULL;
            size_t keylen = 0;
            json_t *kv = json_object_get(ev, "kv");
            const char *k = kv ? json_string_value(json_object_get(kv, "key"))
                               : NULL;

            if (!k || etcd_b64_decode(k, strlen(k), &key, &keylen) < 0) {
                st->why = "watch stream: an event without a key";
                json_decref(j);
                return -1;
            }
            st->cb(st->rock, ETCD_WATCH_CHANGE, key, keylen);
            free(key);
        }
    }
    json_decref(j);
    return 0;
}

static size_t etcd_watch_write_cb(char *data, size_t size, size_t nmemb,
                                  void *rock)
{
    struct etcd_watch_state *st = rock;
    size_t n = size * nmemb;
    char *nl;

    if (buf_append(&st->pending, data, n) < 0) {
        st->why = "watch stream: a message too large";
        return 0;
    }
    while (st->pending.len &&
           (nl = memchr(st->pending.s, '\n', st->pending.len)) != NULL) {
        size_t linelen = (size_t)(nl - st->pending.s);

        if (etcd_watch_line(st, st->pending.s, linelen) < 0)
            return 0;
        memmove(st->pending.s, nl + 1, st->pending.len - linelen - 1);
        st->pending.len -= linelen + 1;
    }
    return n;
}

static int etcd_watch_progress_cb(void *rock, curl_off_t dltotal,
                                  curl_off_t dlnow, curl_off_t ultotal,
                                  curl_off_t ulnow)
{
    struct etcd_watch_state *st = rock;

    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    if (st->stop(st->rock)) {
        st->stopped = 1;
        return 1;   /* aborts the transfer */
    }
    return 0;
}

/* The watch's socket: a peer that vanished without a FIN (a cut link,
 * a machine that lost power) is noticed within about 11 s, by
 * keepalive probes after 5 s of silence, 2 s apart, 3 of them, and
 * unacknowledged data gives up after 15 s; without this a silent watch
 * would look healthy for hours while changes went unseen. */
static int etcd_watch_sockopt(void *rock, curl_socket_t fd,
                              curlsocktype purpose)
{
    int idle = 5, intvl = 2, cnt = 3, on = 1;
    unsigned int user_timeout_ms = 15000;

    (void)rock;
    if (purpose != CURLSOCKTYPE_IPCXN)
        return CURL_SOCKOPT_OK;
    /* a UNIX socket (no TCP options) is fine as it is */
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
                     sizeof(user_timeout_ms));
    return CURL_SOCKOPT_OK;
}

int etcd_watch(struct etcd_client *c, const char *key, size_t keylen,
               const char *end, size_t endlen, etcd_watch_fn *cb,
               int (*stop)(void *rock), void *rock, const char **why_r)
{
    struct etcd_watch_state st;
    json_t *body = json_object(), *req = json_object();
    char *text = NULL, url[1024];
    long status = 0;
    CURLcode cr;
    int r = ETCD_UNAVAILABLE;

    memset(&st, 0, sizeof(st));
    st.cb = cb;
    st.stop = stop;
    st.rock = rock;
    buf_set_max(&st.pending, (size_t)64 << 20);
    *why_r = "out of memory";
    if (!body || !req || etcd_set_bytes(req, "key", key, keylen) < 0 ||
        (endlen && etcd_set_bytes(req, "range_end", end, endlen) < 0) ||
        json_object_set(body, "create_request", req) < 0 ||
        !(text = json_dumps(body, JSON_COMPACT))) {
        r = ETCD_NOMEM;
        goto out;
    }
    snprintf(url, sizeof(url), "%s/v3/watch", c->endpoints[c->current]);
    curl_easy_setopt(c->curl, CURLOPT_URL, url);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, etcd_watch_write_cb);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, 0L);
    curl_easy_setopt(c->curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c->curl, CURLOPT_XFERINFOFUNCTION,
                     etcd_watch_progress_cb);
    curl_easy_setopt(c->curl, CURLOPT_XFERINFODATA, &st);
    curl_easy_setopt(c->curl, CURLOPT_SOCKOPTFUNCTION, etcd_watch_sockopt);
    /* a new connection, so that its socket gets the options */
    curl_easy_setopt(c->curl, CURLOPT_FRESH_CONNECT, 1L);
    cr = curl_easy_perform(c->curl);
    curl_easy_setopt(c->curl, CURLOPT_SOCKOPTFUNCTION, NULL);
    curl_easy_setopt(c->curl, CURLOPT_FRESH_CONNECT, 0L);
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
    if (st.stopped) {
        r = ETCD_OK;
        *why_r = NULL;
    } else {
        if (st.why)
            *why_r = st.why;
        else if (cr != CURLE_OK)
            *why_r = cr == CURLE_COULDNT_CONNECT
                         ? "watch: could not connect"
                         : "watch stream: the connection failed";
        else if (status != 200)
            *why_r = "watch: an HTTP error";
        else
            *why_r = "watch stream: ended by etcd";
        /* the next stream goes to the next member */
        c->current = (c->current + 1) % c->nendpoints;
    }
out:
    curl_easy_setopt(c->curl, CURLOPT_NOPROGRESS, 1L);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    free(text);
    json_decref(req);
    json_decref(body);
    buf_free(&st.pending);
    return r;
}

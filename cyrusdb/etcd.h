/*
 * etcd.h - a small client for etcd's v3 JSON gateway (etcd 3.4).
 *
 * Speaks HTTP/1.1 POST to ENDPOINT/v3/kv/range, /v3/kv/put,
 * /v3/kv/deleterange, /v3/kv/txn and /v3/watch (a stream) with libcurl
 * (one keep-alive easy handle per client) and jansson; keys and values
 * travel base64 encoded.
 * Keys and values are byte strings (NUL bytes allowed).
 *
 * Timeouts and errors live here, so a caller sees a local call that can
 * fail:
 *   ETCD_OK           the cluster answered;
 *   ETCD_UNAVAILABLE  no member answered in time, or the answer was an
 *                     HTTP error (5xx: no leader, no quorum, timeout inside
 *                     etcd) or not the JSON etcd sends.  For a write or a
 *                     txn the outcome is then unknown: it may have been
 *                     applied.  Logged once per burst of failures;
 *   ETCD_COMPACTED    a read at an old revision that etcd compacted away;
 *   ETCD_REFUSED      etcd refused the request itself (HTTP 4xx: too large,
 *                     too many operations in one txn); nothing was applied;
 *   ETCD_NOMEM        out of memory.
 * Endpoints are tried in turn, starting with the last one that answered.
 * A request goes to the next endpoint when the connection could not be
 * made (nothing was sent); a read also when the member timed out or
 * answered with a server error.  A write is never sent twice.
 *
 * A client belongs to one process and one thread.
 */
#ifndef CYRUSDB_ETCD_H
#define CYRUSDB_ETCD_H

#include <stddef.h>
#include <stdint.h>

enum {
    ETCD_OK = 0,
    ETCD_UNAVAILABLE = -1,
    ETCD_COMPACTED = -2,
    ETCD_REFUSED = -3,
    ETCD_NOMEM = -4,
};

/* Where and how to connect; strings are copied by etcd_client_new(). */
struct etcd_settings {
    const char *endpoints;   /* comma-separated http(s)://host:port */
    long timeout_ms;         /* per request, connection included */
    const char *cacert;      /* PEM file of the CA; NULL or "": system's */
    const char *cert;        /* client certificate (PEM); NULL or "": none */
    const char *key;         /* its private key (PEM) */
};

struct etcd_client;

/* 0 and *c_r, or -1 with a message in *error_r (static text). */
int etcd_client_new(const struct etcd_settings *s, struct etcd_client **c_r,
                    const char **error_r);
void etcd_client_free(struct etcd_client **cp);

struct etcd_kv {
    char *key;
    size_t keylen;
    char *value;
    size_t valuelen;
    int64_t mod_revision;
    int64_t create_revision;
};

struct etcd_range {
    struct etcd_kv *kvs;
    size_t n;
    int more;               /* more keys in the range than returned */
    int64_t revision;       /* the store's revision the read saw */
};

/* Keys in [key, end) (endlen 0: the one key), at most limit (0: all), at
 * `revision` (0: the newest); linearizable.  *out is filled on ETCD_OK
 * and must be freed with etcd_range_free() (also harmless after errors). */
int etcd_range(struct etcd_client *c, const char *key, size_t keylen,
               const char *end, size_t endlen, long limit, int64_t revision,
               struct etcd_range *out);
void etcd_range_free(struct etcd_range *r);

/* The first key after every key starting with prefix: the range end of a
 * prefix walk.  *endlen_r 0 means "no end" (prefix all 0xff bytes): the
 * caller then passes "\0" as etcd's "to the end of the key space". */
void etcd_prefix_end(const char *prefix, size_t len, char *out,
                     size_t *endlen_r);

enum etcd_cmp_kind {
    ETCD_CMP_MOD_EQUAL,    /* the key's mod_revision == rev (0: absent) */
    ETCD_CMP_ABSENT,       /* the key does not exist (create_revision 0) */
    ETCD_CMP_PRESENT,      /* the key exists */
    ETCD_CMP_RANGE_OLDER,  /* every key in [key, end) has mod_revision <= rev */
};

struct etcd_cmp {
    enum etcd_cmp_kind kind;
    const char *key;
    size_t keylen;
    const char *end;        /* ETCD_CMP_RANGE_OLDER only */
    size_t endlen;
    int64_t rev;
};

struct etcd_op {
    int delete;             /* 1: delete key; 0: put key = value */
    const char *key;
    size_t keylen;
    const char *value;
    size_t valuelen;
};

/* One atomic txn: if every compare holds, apply every op; *succeeded_r
 * says which.  On ETCD_UNAVAILABLE the outcome is unknown. */
int etcd_txn(struct etcd_client *c, const struct etcd_cmp *cmps, size_t ncmps,
             const struct etcd_op *ops, size_t nops, int *succeeded_r);

/* Put one key. */
int etcd_put(struct etcd_client *c, const char *key, size_t keylen,
             const char *value, size_t valuelen);

/* Delete one key; *deleted_r = how many keys went (0 or 1). */
int etcd_delete(struct etcd_client *c, const char *key, size_t keylen,
                long *deleted_r);

/* A watch: the changes of the keys in [key, end) from now on.
 * etcd_watch() opens one watch stream (on the endpoint that answered
 * last; the next one when that fails) and calls cb for what it reports:
 * ETCD_WATCH_CREATED once the watch is in place (every change after
 * this is reported), then ETCD_WATCH_CHANGE with the key of each put or
 * delete.  It returns when stop(rock) says so (asked at least once a
 * second): ETCD_OK; or when the stream could not be opened, ended, or
 * carried something that is not etcd's: ETCD_UNAVAILABLE, with a reason
 * (static text) in *why_r; then changes may have been missed.  No
 * timeout applies to the stream itself (TCP keepalive is on).
 * Logs nothing and touches no state but c's, so it may run in a thread
 * of its own; c must then be used by that thread only (create it before
 * starting the thread: etcd_client_new() initialises libcurl once per
 * process). */
enum etcd_watch_event {
    ETCD_WATCH_CREATED,
    ETCD_WATCH_CHANGE
};
typedef void etcd_watch_fn(void *rock, enum etcd_watch_event ev,
                           const char *key, size_t keylen);
int etcd_watch(struct etcd_client *c, const char *key, size_t keylen,
               const char *end, size_t endlen, etcd_watch_fn *cb,
               int (*stop)(void *rock), void *rock, const char **why_r);

#endif

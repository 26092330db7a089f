/*
 * cyrusdb_etcd.h - settings of the cyrusdb "etcd" backend.
 *
 * The backend keeps a database in an etcd cluster instead of a file (see
 * cyrusdb_etcd.c and doc/ARCHITECTURE.md).  Where the cluster is comes from
 * imapd.conf: etcd_endpoints, etcd_prefix, etcd_timeout, etcd_cacert,
 * etcd_cert, etcd_key.  A program that may open etcd databases calls
 * cyrusdb_etcd_configure() once its configuration is loaded, before it
 * opens them; without the call the table's defaults apply (a single
 * member at http://127.0.0.1:2379, prefix "/cyrusdeliver/", 5000 ms).
 */
#ifndef CYRUSDB_CYRUSDB_ETCD_H
#define CYRUSDB_CYRUSDB_ETCD_H

#include <stddef.h>

struct imapconf;

/* Copy the etcd_* settings of conf for handles opened from now on.
 * 0, or -1 when memory ran out (logged). */
int cyrusdb_etcd_configure(const struct imapconf *conf);

/* Watch database fname (named as to cyrusdb_open(); opened without
 * CYRUSDB_MBOXSORT) for changes made from now on: blocks in
 * etcd_watch() (cyrusdb/etcd.h) on a client of its own and calls cb
 * with created = 1 once the watch is in place, then with created = 0
 * and the record's key (as cyrusdb knows it) for each record stored or
 * deleted.  Returns 0 when stop(rock) said so, -1 with *why_r (static
 * text) when the stream failed or ended (changes may have been missed;
 * call again).  Logs nothing: made for a thread of its own, started
 * after cyrusdb_etcd_configure() and after a first cyrusdb_open() of an
 * etcd database in the process (libcurl's one-time initialisation). */
typedef void cyrusdb_etcd_watch_fn(void *rock, int created, const char *key,
                                   size_t keylen);
int cyrusdb_etcd_watch(const char *fname, cyrusdb_etcd_watch_fn *cb,
                       int (*stop)(void *rock), void *rock,
                       const char **why_r);

#endif

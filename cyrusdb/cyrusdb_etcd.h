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

struct imapconf;

/* Copy the etcd_* settings of conf for handles opened from now on.
 * 0, or -1 when memory ran out (logged). */
int cyrusdb_etcd_configure(const struct imapconf *conf);

#endif

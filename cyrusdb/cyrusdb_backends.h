/*
 * cyrusdb_backends.h - the backend tables, for the registry in cyrusdb.c
 * only.  Adding a backend: one file, one row in cyrusdb.c, one Makefile.am
 * line.
 */
#ifndef CYRUSDB_BACKENDS_H
#define CYRUSDB_BACKENDS_H

#include "cyrusdb/cyrusdb.h"

extern const struct cyrusdb_backend cyrusdb_flat;
extern const struct cyrusdb_backend cyrusdb_skiplist;
extern const struct cyrusdb_backend cyrusdb_db3;
extern const struct cyrusdb_backend cyrusdb_lmdb;
extern const struct cyrusdb_backend cyrusdb_etcd;

/* Returns CYRUSDB_NOTIMPLEMENTED; for table slots a backend lacks. */
int cyrusdb_notimplemented(struct cyrusdb *db);

#endif

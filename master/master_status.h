/*
 * master_status.h - the master's status file, for admins and
 * tools/masterstatus.
 *
 * Format (text, one record a line, fields key=value, no spaces in values):
 *   master pid=N started=EPOCH updated=EPOCH
 *   service NAME listen=L ready=N busy=N total=N served=N maxchild=N
 *           backoff=SECONDS [stopping=1]
 *   child NAME pid=N state=ready|busy|starting|stopping served=N age=SECONDS
 *   event NAME pid=N state=running|waiting next=EPOCH   (EVENTS, DAEMON)
 * "served" of a service counts connections of its children, past and
 * present, as reported; "age" is seconds since the fork.  The file is
 * replaced atomically (temporary file + rename; not synced: it is
 * rebuilt every second) at most once a second, and at once on a change
 * of state.  A file whose "updated" is older than 10 s means the master
 * is not running.
 */
#ifndef MASTER_MASTER_STATUS_H
#define MASTER_MASTER_STATUS_H

#include <sys/types.h>

/* Remember the file name (copied) and the master's pid. */
void master_status_init(const char *path);

/* Rewrite the file when changed is non-zero or a second has passed since
 * the last write (now: monotonic seconds).  Failures are logged once. */
void master_status_update(double now, int changed);

/* Remove the file (at exit) and forget the name. */
void master_status_remove(void);

#endif

/*
 * idlenotify.h - wake IMAP IDLE sessions when a mailbox changes, without
 * polling (RFC 2177 sessions that wait for news of their mailbox).
 *
 * A session that idles on a mailbox takes a slot in a table shared by
 * every process of the server (CONFIGDIR/idle.shm) holding its pid and a
 * hash of the mailbox's spool directory, and a datagram socket of its own
 * whose descriptor its wait watches (prot_set_wakefd).  Whoever changes a
 * mailbox (mailbox_unlock() after a header write: appends, flag changes,
 * expunges, recovery) calls idlenotify_changed(): one pass over the
 * table, and one datagram of one byte, sent without waiting, to each
 * session idling on that mailbox.  The session then looks at the index
 * as before and reports what changed.  No process wakes while nothing
 * changes; a change reaches a session in one datagram.
 *
 * The sockets are in Linux's abstract namespace: the name holds a random
 * id of the table (so two servers on one machine never meet) and the
 * session's pid; nothing is left in the file system by a killed process.
 * A slot whose socket no longer exists (the process died) is freed by
 * the first writer that finds it so.  A datagram may be lost (a full
 * receive queue means a wake-up is pending anyway) or spurious (any
 * local process can send one): the session only ever re-checks the
 * index, so neither changes what it reports.
 *
 * When the table is full or cannot be made, idlenotify_watch() fails
 * and the session falls back to looking at the index periodically.
 * Library code: never exits; errors are logged once per process.
 */
#ifndef STORE_IDLENOTIFY_H
#define STORE_IDLENOTIFY_H

#include "lib/imapconf.h"

/* Slots in the table: sessions that can idle push-woken at once (more
 * fall back to polling). */
#define IDLENOTIFY_SLOTS 8192

struct idlenotify_watch;

/* Start watching the mailbox whose spool directory is dir: *w_r gets the
 * watch, and the return value is the descriptor that becomes readable
 * when the mailbox may have changed.  -1 when push notification is not
 * available (the caller polls). */
int idlenotify_watch(const struct imapconf *conf, const char *dir,
                     struct idlenotify_watch **w_r);

/* The descriptor of a watch. */
int idlenotify_fd(const struct idlenotify_watch *w);

/* Consume what made the descriptor readable.  Returns the number of
 * notifications read (0 if none: a spurious wake-up). */
int idlenotify_drain(struct idlenotify_watch *w);

/* End the watch: the slot is freed and the socket closed.  *wp = NULL;
 * no-op on NULL. */
void idlenotify_unwatch(struct idlenotify_watch **wp);

/* Tell the sessions watching dir that it changed.  Cheap when nobody
 * watches (one pass over the table); never blocks. */
void idlenotify_changed(const struct imapconf *conf, const char *dir);

/* Counters of this process (for tests and metrics): datagrams sent,
 * stale slots freed. */
void idlenotify_counters(unsigned long long *sent_r,
                         unsigned long long *freed_r);

#endif

/*
 * master_event.h - the START, EVENTS and DAEMON sections of cyrus.conf.
 *
 * START: each command is run to completion, in file order, before any
 * service child is forked; a command that cannot be run or exits non-zero
 * stops the start.
 * EVENTS: "period=MIN" runs the command at startup (and after a reload
 * that adds it) and then every MIN minutes; "at=HHMM" runs it daily at
 * that local time.  An event still running when it is due again is not
 * started twice (logged).
 * DAEMON: the command is kept running: restarted 1 s after it exits,
 * doubling to 64 s while it keeps dying within 10 s of its start.
 * Children get fds 0-2 of the master, CYRUSDELIVER_CONF,
 * CYRUSDELIVER_CONF_WARNED and CYRUSDELIVER_MASTER_PID, and nothing else;
 * every one (START's too) is reaped through metrics_reaped().
 * On reload, entries are matched by name: removed ones are no longer run
 * (a running daemon gets SIGTERM), changed ones use the new command from
 * their next run.
 */
#ifndef MASTER_MASTER_EVENT_H
#define MASTER_MASTER_EVENT_H

#include <sys/types.h>

#include "lib/buf.h"
#include "master/master_conf.h"

/* Run the START entries.  0, or -1 after logging which one failed. */
int master_event_start(const struct master_conf *conf);

/* Take over the EVENTS and DAEMON entries of conf (first load or reload). */
void master_event_apply(const struct master_conf *conf, double now);

/* Start what is due; lower *deadline to the next due time. */
void master_event_run(double now, double *deadline);

/* 1 when pid was an event or daemon child (logged), else 0. */
int master_event_reaped(pid_t pid, int wstatus, double now);

/* Start nothing more; SIGTERM to running daemons and events. */
void master_event_shutdown(void);

/* Send sig to every running event or daemon child. */
void master_event_killall(int sig);

/* Number of running event and daemon children. */
size_t master_event_nchildren(void);

/* Append the status-file lines (see master_status.h). */
void master_event_status(struct buf *out, double now);

/* Forget everything (children are not signalled). */
void master_event_free(void);

#endif

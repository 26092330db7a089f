/*
 * master_metrics.h - the master's part of the metrics (lib/metrics.h):
 * when imapd.conf sets metrics_listen, a DAEMON entry "metricsd" (unless
 * cyrus.conf has an entry of that name) and a new CONFIGDIR/metrics.shm
 * at start; the slots of reaped children are folded by metrics_reaped()
 * and the services' state is written by master_service_metrics().
 */
#ifndef MASTER_MASTER_METRICS_H
#define MASTER_MASTER_METRICS_H

#include "lib/imapconf.h"
#include "master/master_conf.h"

/* Add the DAEMON entry "metricsd" (cmd "metricsd", found as any command
 * word) when metrics_listen is set and no entry has that name.  Logged
 * when memory runs out (then metrics are not served). */
void master_metrics_conf(struct master_conf *conf, const struct imapconf *ic);

/* Create the shared file when metrics_listen is set (after the switch to
 * cyrus_user: the workers and metricsd open it). */
void master_metrics_start(const struct imapconf *ic);

#endif

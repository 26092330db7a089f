/*
 * master_compat.h - the commands of a cyrus.conf written for Cyrus IMAP,
 * mapped to our programs.
 *
 * A stock cyrus.conf (Debian's, Cyrus's samples) names Cyrus's programs:
 * "ctl_cyrusdb -r", "/usr/sbin/cyrus expire -E 3", "/usr/lib/cyrus/bin/
 * tls_prune", "pop3d -U 30".  Run as written they would be Cyrus's own
 * programs working on Cyrus's files (or nothing at all): our databases
 * would never be recovered, and a service whose program is missing would
 * take connections that nobody answers.  master_compat_apply() rewrites
 * such entries once, when the file is loaded (start and SIGHUP):
 *
 *   Cyrus's command                      becomes (OURS = our program)
 *   ctl_cyrusdb -r                       OURS/ctl_cyrusdb -C CONF -r
 *   ctl_cyrusdb -c                       OURS/ctl_cyrusdb -C CONF -c
 *   ctl_deliver -E AGE                   OURS/cyr_expire -C CONF -E AGE
 *   cyr_expire [-E AGE] [-X AGE] [-D AGE]
 *                                        OURS/cyr_expire -C CONF [same]
 *   imapd [-s] [-U N] [-T N]             OURS/imapd -C CONF [same]
 *   lmtpd [-a] [-U N] [-T N]             OURS/lmtpd -C CONF [same]
 *   timsieved [-U N] [-T N]              OURS/timsieved -C CONF [same]
 *
 * AGE: Cyrus's NUMBER with an optional unit d/h/m/s, passed on as
 * written (our cyr_expire reads the same syntax); a malformed one is
 * dropped.  Other options are dropped (listed in the info line): -C
 * (ours is always given), ctl_cyrusdb -x, cyr_expire -A, -a, -v, -x, -p,
 * -u, -t, -c, service -D, -N, -p.  CONF is the master's imapd.conf; OURS is the first
 * directory holding that program of: -S servicedir, the master's own
 * directory, (build tree) its siblings lmtpd/, imapd/, timsieved/, tools/, and the
 * installed workers' directory (pkglibexecdir, compiled in).
 *
 * What counts as Cyrus's command: the word after the Debian wrapper
 * "cyrus" (any directory; "expire" -> cyr_expire, NAME -> cyr_NAME or
 * ctl_NAME as the wrapper does), a program in Cyrus's directories
 * (/usr/lib/cyrus/bin, /usr/libexec/cyrus-imapd, /usr/lib/cyrus-imapd,
 * /usr/cyrus/bin, /usr/local/cyrus/bin), or a bare name that is one of
 * Cyrus's programs and not one of ours.  A leading "nice [-n N]" is kept
 * and looked through.  A command naming one of OUR programs (by path or
 * by bare name) is left alone, as is any other program that exists.
 *
 * Entries that cannot work are taken out of the configuration with one
 * warning each, "FILE:LINE: SECTION entry=<NAME> cmd=<CMD> skipped:
 * WHY" (SERVICES: "refused", and no socket is opened):
 * - Cyrus programs with no equivalent here (tls_prune, squatter, idled,
 *   pop3d, nntpd, httpd, notifyd, ctl_mboxlist, ...), and
 *   ctl_cyrusdb / ctl_deliver / cyr_expire invocations that ask for
 *   nothing we do;
 * - a service program (imapd, lmtpd, timsieved) outside SERVICES, a tool in
 *   SERVICES or DAEMON;
 * - a mapped program of ours that cannot be found;
 * - SERVICES, EVENTS and DAEMON entries whose program does not exist
 *   (START entries are left alone: a START command that cannot run
 *   still stops the master's start).
 * Every mapped entry gets one info line "... runs=<NEW CMD>".
 */
#ifndef MASTER_MASTER_COMPAT_H
#define MASTER_MASTER_COMPAT_H

#include "master/master_conf.h"

/* Rewrite conf in place as above.  confname names the file in messages;
 * servicedir and masterdir (may be NULL) are where our programs are
 * looked for (kept, not copied: they must stay valid for
 * master_compat_find_ours()); imapdconf (absolute) is given to every mapped command.
 * Must run after master_service_setup() (bare names are resolved the way
 * master_service_resolve() does).  Returns the number of entries
 * removed. */
size_t master_compat_apply(struct master_conf *conf, const char *confname,
                           const char *servicedir, const char *masterdir,
                           const char *imapdconf);

/* Our program `name` (a bare name: lmtpd, imapd, metricsd, a tool): its
 * malloc'ed path, looked for in the servicedir and masterdir given to the
 * last master_compat_apply(), the build tree's sibling directories of the
 * master (lmtpd/, imapd/, metricsd/, timsieved/, tools/), then the compiled-in
 * libexec directory; NULL when none has it. */
char *master_compat_find_ours(const char *name);

#endif

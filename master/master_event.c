/*
 * master_event.c - START, EVENTS and DAEMON (see master_event.h).
 *
 * Invariants: an entry has at most one running child (pid > 0); an entry
 * marked removed is freed once it has none; due times are monotonic
 * seconds, "at" times converted from the local wall clock when computed.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/metrics.h"
#include "master/master_event.h"
#include "master/master_service.h"

struct event {
    char *name;
    char *cmd;
    enum master_section section;    /* EVENTS or DAEMON */
    int period;                     /* minutes */
    int at;                         /* HHMM or -1 */
    pid_t pid;
    double started;
    double next;                    /* when to run next */
    int delay;                      /* DAEMON restart delay */
    int removed;
    int signalled;                  /* the master sent it SIGTERM */
    struct event *next_ev;
};

static struct event *events;
static int events_stopping;

/* The environment of START, EVENTS and DAEMON children: the master's pid,
 * so that a program (ctl_cyrusdb -c) knows the master reaps it and folds
 * its metrics slot. */
static char **event_env(void)
{
    static char pidenv[64];
    static char *env[2];

    snprintf(pidenv, sizeof(pidenv), "CYRUSDELIVER_MASTER_PID=%ld",
             (long)getpid());
    env[0] = pidenv;
    env[1] = NULL;
    return env;
}

int master_event_start(const struct master_conf *conf)
{
    size_t i;

    for (i = 0; i < conf->nentries; i++) {
        const struct master_entry *e = &conf->entries[i];
        char **argv;
        pid_t pid;
        int st;

        if (e->section != MASTER_SECTION_START) continue;
        argv = master_conf_split_cmd(e->cmd);
        if (!argv || !argv[0]) {
            master_conf_argv_free(argv);
            log_error("master: START entry=<%s> bad cmd=<%s>", e->name,
                      e->cmd);
            return -1;
        }
        log_info("master: START running entry=<%s> cmd=<%s>", e->name,
                 e->cmd);
        pid = master_service_forkexec(argv, -1, -1, -1, 0, event_env());
        master_conf_argv_free(argv);
        if (pid < 0) return -1;
        while (waitpid(pid, &st, 0) < 0) {
            if (errno != EINTR) {
                log_error("master: START entry=<%s> waitpid failed "
                          "error=<%s>", e->name, strerror(errno));
                return -1;
            }
        }
        metrics_reaped(pid);
        if (WIFSIGNALED(st)) {
            log_error("master: START entry=<%s> failed signal=<%d> (%s) "
                      "cmd=<%s>", e->name, WTERMSIG(st),
                      master_signame(WTERMSIG(st)), e->cmd);
            return -1;
        }
        if (WEXITSTATUS(st) != 0) {
            log_error("master: START entry=<%s> failed status=<%d>%s "
                      "cmd=<%s>", e->name, WEXITSTATUS(st),
                      WEXITSTATUS(st) == 127 ? " (cannot run)" : "",
                      e->cmd);
            return -1;
        }
    }
    return 0;
}

/* Monotonic time of the next local HHMM after now. */
static double event_next_at(int hhmm, double now)
{
    time_t t = time(NULL), cand;
    struct tm tm;

    localtime_r(&t, &tm);
    tm.tm_hour = hhmm / 100;
    tm.tm_min = hhmm % 100;
    tm.tm_sec = 0;
    tm.tm_isdst = -1;
    cand = mktime(&tm);
    if (cand <= t) {
        tm.tm_mday += 1;
        tm.tm_isdst = -1;
        cand = mktime(&tm);
    }
    return now + (double)(cand - t);
}

static void event_schedule(struct event *ev, double now, int first)
{
    if (ev->section == MASTER_SECTION_DAEMON) {
        ev->next = first ? now : now + ev->delay;
    } else if (ev->at >= 0) {
        ev->next = event_next_at(ev->at, now);
    } else {
        ev->next = first ? now : now + 60.0 * ev->period;
    }
}

static void event_free_one(struct event *ev)
{
    free(ev->name);
    free(ev->cmd);
    free(ev);
}

static void event_collect(void)
{
    struct event **ep = &events;

    while (*ep) {
        struct event *ev = *ep;
        if (ev->removed && ev->pid <= 0) {
            *ep = ev->next_ev;
            event_free_one(ev);
            continue;
        }
        ep = &ev->next_ev;
    }
}

void master_event_apply(const struct master_conf *conf, double now)
{
    struct event *ev, **tail;
    size_t i;

    for (ev = events; ev; ev = ev->next_ev) {
        const struct master_entry *e = master_conf_find(conf, ev->name);

        if (ev->removed) continue;
        if (!e || e->section != ev->section) {
            ev->removed = 1;
            if (ev->pid > 0 && ev->section == MASTER_SECTION_DAEMON)
                kill(ev->pid, SIGTERM);
            log_info("event=<%s> removed", ev->name);
            continue;
        }
        if (strcmp(ev->cmd, e->cmd) != 0) {
            char *c = strdup(e->cmd);
            if (!c) log_fatal(71, "master: out of memory");
            free(ev->cmd);
            ev->cmd = c;
        }
        if (ev->section == MASTER_SECTION_EVENTS
            && (ev->period != e->period || ev->at != e->at)) {
            ev->period = e->period;
            ev->at = e->at;
            event_schedule(ev, now, 0);
        }
    }

    tail = &events;
    while (*tail) tail = &(*tail)->next_ev;
    for (i = 0; i < conf->nentries; i++) {
        const struct master_entry *e = &conf->entries[i];
        int found = 0;

        if (e->section != MASTER_SECTION_EVENTS
            && e->section != MASTER_SECTION_DAEMON)
            continue;
        for (ev = events; ev; ev = ev->next_ev)
            if (!ev->removed && strcmp(ev->name, e->name) == 0) found = 1;
        if (found) continue;
        ev = calloc(1, sizeof(*ev));
        if (!ev) log_fatal(71, "master: out of memory");
        ev->name = strdup(e->name);
        ev->cmd = strdup(e->cmd);
        if (!ev->name || !ev->cmd) log_fatal(71, "master: out of memory");
        ev->section = e->section;
        ev->period = e->period;
        ev->at = e->at;
        ev->delay = 1;
        event_schedule(ev, now, 1);
        *tail = ev;
        tail = &ev->next_ev;
    }
    event_collect();
}

void master_event_run(double now, double *deadline)
{
    struct event *ev;

    if (events_stopping) return;
    for (ev = events; ev; ev = ev->next_ev) {
        if (ev->removed) continue;
        if (now >= ev->next) {
            if (ev->pid > 0) {
                if (ev->section == MASTER_SECTION_EVENTS)
                    log_warning("event=<%s> still running pid=<%d>: "
                                "skipped", ev->name, (int)ev->pid);
                event_schedule(ev, now, 0);
            } else {
                char **argv = master_conf_split_cmd(ev->cmd);
                if (!argv || !argv[0]) {
                    log_error("event=<%s> bad cmd=<%s>", ev->name, ev->cmd);
                    ev->pid = -1;
                } else {
                    ev->pid = master_service_forkexec(argv, -1, -1, -1, 0,
                                                      event_env());
                    ev->started = now;
                    ev->signalled = 0;
                    if (ev->pid > 0)
                        log_info("event=<%s> started pid=<%d>", ev->name,
                                 (int)ev->pid);
                }
                master_conf_argv_free(argv);
                if (ev->section == MASTER_SECTION_EVENTS || ev->pid <= 0)
                    event_schedule(ev, now, 0);
                else
                    ev->next = now + 1e9;   /* daemon: on exit */
            }
        }
        if (ev->next < *deadline) *deadline = ev->next;
    }
}

int master_event_reaped(pid_t pid, int wstatus, double now)
{
    struct event *ev;

    for (ev = events; ev; ev = ev->next_ev) {
        if (ev->pid != pid) continue;
        ev->pid = 0;
        if (WIFSIGNALED(wstatus) && ev->signalled &&
            WTERMSIG(wstatus) == SIGTERM)
            log_info("event=<%s> pid=<%d> stopped signal=<%d> (%s)",
                     ev->name, (int)pid, SIGTERM, master_signame(SIGTERM));
        else if (WIFSIGNALED(wstatus))
            log_warning("event=<%s> pid=<%d> crashed signal=<%d> (%s)",
                        ev->name, (int)pid, WTERMSIG(wstatus),
                        master_signame(WTERMSIG(wstatus)));
        else if (WEXITSTATUS(wstatus) != 0)
            log_warning("event=<%s> pid=<%d> exited status=<%d>",
                        ev->name, (int)pid, WEXITSTATUS(wstatus));
        else
            log_info("event=<%s> pid=<%d> exited status=<0>", ev->name,
                     (int)pid);
        if (ev->section == MASTER_SECTION_DAEMON && !ev->removed) {
            if (now - ev->started < 10.0) {
                ev->delay = ev->delay < 64 ? ev->delay * 2 : 64;
                if (ev->delay > 64) ev->delay = 64;
            } else {
                ev->delay = 1;
            }
            ev->next = now + ev->delay;
            log_info("daemon=<%s> restart seconds=<%d>", ev->name,
                     ev->delay);
        }
        event_collect();
        return 1;
    }
    return 0;
}

void master_event_shutdown(void)
{
    events_stopping = 1;
    master_event_killall(SIGTERM);
}

void master_event_killall(int sig)
{
    struct event *ev;

    for (ev = events; ev; ev = ev->next_ev)
        if (ev->pid > 0) {
            if (sig == SIGTERM)
                ev->signalled = 1;   /* its end is a stop, not a crash */
            kill(ev->pid, sig);
        }
}

size_t master_event_nchildren(void)
{
    struct event *ev;
    size_t n = 0;

    for (ev = events; ev; ev = ev->next_ev)
        if (ev->pid > 0) n++;
    return n;
}

void master_event_status(struct buf *out, double now)
{
    struct event *ev;
    long wall = (long)time(NULL);

    for (ev = events; ev; ev = ev->next_ev) {
        if (ev->removed && ev->pid <= 0) continue;
        buf_printf(out, "event %s pid=%d state=%s next=%ld\n", ev->name,
                   ev->pid > 0 ? (int)ev->pid : 0,
                   ev->pid > 0 ? "running" : "waiting",
                   ev->next > now + 1e8 ? 0L
                   : wall + (long)(ev->next - now));
    }
}

void master_event_free(void)
{
    while (events) {
        struct event *ev = events;
        events = ev->next_ev;
        event_free_one(ev);
    }
    events_stopping = 0;
}

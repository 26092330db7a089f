/*
 * procid.h - this process's id without a system call per question.
 *
 * Handles that must not be used across fork() (the quota and LMDB
 * handles, the mailbox registry, log lines) compare getpid() with the pid
 * that opened them, several times per delivery.  procid_get() answers
 * from memory: the value is taken once per process, and a pthread_atfork()
 * child handler (registered on first use) forgets it in every child made
 * by fork(), so a child gets its own pid at its first question.  A process
 * image replaced by exec starts with nothing remembered.  Children made
 * without fork() (vfork(), a raw clone()) must not call it before exec;
 * nothing in the project makes such children.
 */
#ifndef CYRUSDELIVER_LIB_PROCID_H
#define CYRUSDELIVER_LIB_PROCID_H

#include <sys/types.h>

/* getpid(), remembered per process (see above). */
pid_t procid_get(void);

#endif

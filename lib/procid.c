/*
 * procid.c - this process's id, remembered (see procid.h).
 */
#include "config.h"

#include <pthread.h>
#include <unistd.h>

#include "lib/procid.h"

static pid_t procid_cached;      /* 0: not known in this process */
static int procid_registered;    /* the fork handler is in place */

static void procid_forget(void)
{
    procid_cached = 0;           /* runs in the child of every fork() */
}

pid_t procid_get(void)
{
    if (procid_cached == 0) {
        if (!procid_registered) {
            /* without the handler every answer comes from getpid() */
            if (pthread_atfork(NULL, NULL, procid_forget) != 0)
                return getpid();
            procid_registered = 1;
        }
        procid_cached = getpid();
    }
    return procid_cached;
}

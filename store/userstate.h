/*
 * userstate.h - a backend's mark that a user is being moved to another
 * backend, or has left (the frontend tier's user moves, tools/cyr_user.c
 * and mbtool userdump/usermark).
 *
 * File CONFIGDIR/user/H/USER.moved (store_user_path(), suffix ".moved"),
 * one line:
 *   moving LF                  a move is copying the user away
 *   moved SP BACKEND LF        the user lives on BACKEND now
 * Written to a temporary file, synced, renamed over, the directory
 * synced; removed (directory synced) to clear the mark.  No file: the
 * user is here as usual.
 *
 * Who reads it: lmtpd at RCPT (a marked user gets 451 4.2.1, never a
 * 250: a frontend whose directory cache is stale retries later and then
 * reaches the new backend), imapd at a login (NO [UNAVAILABLE]) and
 * before each command of a session of the user (BYE).  A file that
 * cannot be read counts as "moving" (fail closed, logged).
 * Creating the user's INBOX here again (IMAP CREATE, mbtool userload)
 * clears the mark.
 */
#ifndef STORE_USERSTATE_H
#define STORE_USERSTATE_H

#include "lib/buf.h"
#include "lib/imapconf.h"

#define USERSTATE_SUFFIX ".moved"

enum userstate {
    USERSTATE_HERE = 0,     /* no mark */
    USERSTATE_MOVING,       /* being copied away */
    USERSTATE_MOVED         /* gone; where to in the backend name */
};

/* The mark of userid.  *backend_r (may be NULL) gets the new backend of
 * USERSTATE_MOVED (else ""), at most 64 bytes.  Never fails: a user id
 * the store refuses is USERSTATE_HERE (nothing of it exists here), an
 * unreadable or malformed file USERSTATE_MOVING (logged). */
enum userstate userstate_get(const struct imapconf *conf, const char *userid,
                             struct buf *backend_r);

/* Set the mark (USERSTATE_HERE removes it; backend is needed for
 * USERSTATE_MOVED: 1..64 of [A-Za-z0-9._-]).  Durable when it returns.
 * STORE_OK, STORE_BADNAME, STORE_IOERROR, STORE_NOMEM. */
int userstate_set(const struct imapconf *conf, const char *userid,
                  enum userstate state, const char *backend);

/* "here", "moving", "moved". */
const char *userstate_name(enum userstate state);

#endif

/*
 * list.h - IMAP LIST and LSUB (RFC 3501) with LIST-EXTENDED (RFC 5258),
 * LIST-STATUS (RFC 5819) and SPECIAL-USE (RFC 6154).
 *
 * The session (session.c) keeps its state private; it hands this module
 * a struct imaplist_session describing what LIST needs of it: the stream,
 * the mailbox list, the user, and callbacks for name translation, access
 * checks, STATUS lines and tagged replies.  Everything LIST and LSUB
 * allocate is freed before the imaplist_cmd_*() call returns.
 *
 * Special use.  The attributes (\All \Archive \Drafts \Flagged \Junk
 * \Sent \Trash) are stored in the mailbox list entry (mboxlist.h) and
 * shown only on mailboxes of the user's own INBOX hierarchy: they say
 * what a folder is for its owner, and another user who may read it must
 * not take it for its own Sent folder.
 */
#ifndef IMAPD_LIST_H
#define IMAPD_LIST_H

#include "imapd/imapparse.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/prot.h"
#include "store/mboxlist.h"

struct imaplist_session {
    void *rock;                  /* handed back to every callback */
    struct prot *p;
    const struct imapconf *conf;
    const char *userid;          /* internal user id */
    const char *inbox;           /* "user.U" or "D!user.U"; "" for none */
    char sep;                    /* the client's hierarchy separator */
    /* internal name -> client name; STORE_OK or STORE_BADNAME (a name
     * the session cannot see) */
    int (*to_external)(void *rock, const char *name, struct buf *out);
    /* may the session see this mailbox (reachable and the l right)? */
    int (*visible)(void *rock, const char *name, const char *acl);
    /* write "* STATUS ext (...)" for internal name `name` with the items
     * asked; STORE_OK, or a store code with nothing written (no r right,
     * the mailbox is gone...) */
    int (*status)(void *rock, const char *ext, const char *name,
                  const struct imapparse_status *items);
    /* write "* MYRIGHTS ext rights" (RFC 8440) for internal name `name`
     * with ACL `acl` */
    void (*myrights)(void *rock, const char *ext, const char *name,
                     const char *acl);
    /* the tagged reply ("OK", "NO", "BAD"), and the NO for a store code */
    void (*tagged)(void *rock, const char *status, const char *text);
    void (*store_no)(void *rock, int r);
};

/* LIST (every form of imapparse.h's IMAPPARSE_CMD_LIST) and LSUB, answered
 * completely (untagged responses and the tagged reply).  ml is the open
 * mailbox list (NULL: the list could not be opened, answered NO).  After
 * the LIST line of each existing mailbox come its STATUS line (RETURN
 * (STATUS)) and its MYRIGHTS line (RETURN (MYRIGHTS)); the session
 * refuses MYRIGHTS before calling when it does not offer ACL. */
void imaplist_cmd_list(const struct imaplist_session *ls,
                       struct mboxlist *ml, const struct imapparse_cmd *cmd);
void imaplist_cmd_lsub(const struct imaplist_session *ls,
                       struct mboxlist *ml, const struct imapparse_cmd *cmd);

/* The canonical spelling ("\Sent") of a special-use attribute written in
 * any case, or NULL for one this server does not know. */
const char *imaplist_specialuse_canon(const char *attr);

/* The special-use attributes of a CREATE (USE (...)) as a list to store
 * (mboxlist_create_special()) into out: canonical, duplicates dropped.
 * 0, or -1 with *bad_r the first unknown attribute. */
int imaplist_specialuse_list(const struct imapparse_strlist *use,
                             struct buf *out, const char **bad_r);

#endif

/*
 * aclcmd.h - the RFC 4314 ACL commands of imapd: SETACL, DELETEACL,
 * GETACL, LISTRIGHTS, MYRIGHTS, over the mailbox list's ACL strings
 * (store/acl.h, store/mboxlist.h).
 *
 * Each function runs one parsed command (imapcmd.h) in the authenticated
 * or selected state and sends its untagged and tagged responses.
 *
 * Rights are the store's letters l r s w i p k x t e a; c and d are
 * accepted as RFC 4314 2.1.1's "create" (k x) and "delete" (t e) and are
 * shown when any of their members is granted.  A rights string holding
 * any other letter (digits too) is a BAD.  Identifiers are user ids in
 * full as the store keeps them ("bob", "bob@example.com"); a name without
 * a domain given for a mailbox of domain D means the user of D;
 * "anyone" and "anonymous"; a leading '-' names negative rights (RFC
 * 4314 2.2), which the store applies.
 *
 * Permissions: SETACL, DELETEACL, GETACL and LISTRIGHTS need the a right
 * (admins have it where they administer); MYRIGHTS any right.  A mailbox
 * on which the user has neither l nor a is reported as nonexistent.
 */
#ifndef IMAPD_ACLCMD_H
#define IMAPD_ACLCMD_H

struct imap_session;

/* The capabilities the commands below implement. */
#define ACLCMD_CAPABILITIES "ACL RIGHTS=kxte"

void aclcmd_setacl(struct imap_session *s);
void aclcmd_deleteacl(struct imap_session *s);
void aclcmd_getacl(struct imap_session *s);
void aclcmd_listrights(struct imap_session *s);
void aclcmd_myrights(struct imap_session *s);

#endif

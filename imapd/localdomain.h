/*
 * localdomain.h - the domain of the local address a client connected to,
 * for `virtdomains: on` (a login name without "@domain" takes it), as
 * Cyrus IMAP finds it.
 *
 * The lookup: getsockname() on the connection's socket; getnameinfo()
 * with NI_NAMEREQD on that address (a reverse lookup through the
 * resolver: /etc/hosts, DNS, ... as nsswitch.conf says); the host name
 * found is lower-cased and everything after its first '.' is the
 * domain.  So a connection to 192.0.2.10, whose name is
 * "imap.example.com", gives "example.com".  No domain when the socket is
 * not an IPv4/IPv6 one (a UNIX socket), when the address has no name,
 * when the name has no '.', or when what follows the '.' is not a
 * valid domain name (the caller checks that: mboxname_domain_check()).
 * An IPv4-mapped IPv6 address is looked up as the IPv4 address.
 *
 * The lookup may block as long as the resolver does; it is made once per
 * login, only with `virtdomains: on`.
 */
#ifndef IMAPD_LOCALDOMAIN_H
#define IMAPD_LOCALDOMAIN_H

#include "lib/buf.h"

/* The domain of fd's local address into out (lower-cased, not yet
 * validated).  0 when one was found, -1 when there is none (out
 * emptied). */
int localdomain_lookup(int fd, struct buf *out);

#endif

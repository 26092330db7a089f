/*
 * netdial.h - a client connection from a server to another (a frontend
 * to its backends): "host:port", "[v6addr]:port" or "/path" of a UNIX
 * socket, connected within a time limit.
 */
#ifndef LIB_NETDIAL_H
#define LIB_NETDIAL_H

/* A connected, blocking socket (close-on-exec) to addr, tried on each
 * address the host name resolves to, each within timeout seconds; or -1
 * with *why_r (static text or strerror()) saying why the last try
 * failed and errno its error (ETIMEDOUT when it ran out of time). */
int net_dial(const char *addr, int timeout, const char **why_r);

/* The host part of addr ("host" of "host:port", the v6 address of
 * "[v6]:port") into out, for TLS name checks; "" for a UNIX socket or a
 * malformed address. */
void net_dial_host(const char *addr, char *out, size_t outlen);

#endif

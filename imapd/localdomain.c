/*
 * localdomain.c - the domain of a connection's local address (see
 * localdomain.h).
 */
#include "config.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "imapd/localdomain.h"
#include "lib/buf.h"

int localdomain_lookup(int fd, struct buf *out)
{
    struct sockaddr_storage ss;
    struct sockaddr_in sin;
    socklen_t len = sizeof(ss);
    const struct sockaddr *sa = (const struct sockaddr *)&ss;
    char host[NI_MAXHOST];
    const char *dot;

    buf_reset(out);
    if (fd < 0)
        return -1;
    memset(&ss, 0, sizeof(ss));
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;

        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            memset(&sin, 0, sizeof(sin));
            sin.sin_family = AF_INET;
            sin.sin_port = s6->sin6_port;
            memcpy(&sin.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
            sa = (const struct sockaddr *)&sin;
            len = sizeof(sin);
        }
    } else if (ss.ss_family != AF_INET) {
        return -1;
    }
    if (getnameinfo(sa, len, host, sizeof(host), NULL, 0, NI_NAMEREQD) != 0)
        return -1;
    host[sizeof(host) - 1] = '\0';
    dot = strchr(host, '.');
    if (!dot || !dot[1])
        return -1;
    for (dot++; *dot; dot++) {
        char c = *dot;

        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (buf_putc(out, c) < 0) {
            buf_reset(out);
            return -1;
        }
    }
    return 0;
}

/*
 * netdial.c - client connections with a time limit (see netdial.h).
 *
 * The socket is made non-blocking for the connect only, so that a host
 * that drops SYNs costs timeout seconds, not the kernel's minutes; the
 * caller gets a blocking socket and sets its own read timeouts (prot).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "lib/netdial.h"

/* Connect fd (non-blocking) to sa within timeout seconds; then make it
 * blocking again.  0, or -1 with errno. */
static int net_connect_fd(int fd, const struct sockaddr *sa, socklen_t salen,
                          int timeout)
{
    struct pollfd pfd;
    int err = 0, r;
    socklen_t errlen = sizeof(err);

    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS)
            return -1;
        pfd.fd = fd;
        pfd.events = POLLOUT;
        do {
            r = poll(&pfd, 1, timeout * 1000);
        } while (r < 0 && errno == EINTR);
        if (r == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (r < 0)
            return -1;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) != 0)
            return -1;
        if (err) {
            errno = err;
            return -1;
        }
    }
    r = fcntl(fd, F_GETFL);
    if (r < 0 || fcntl(fd, F_SETFL, r & ~O_NONBLOCK) < 0)
        return -1;
    return 0;
}

/* Split "host:port" / "[v6]:port" into host and port.  0, or -1 with
 * *why_r. */
static int net_split(const char *addr, char *host, size_t hostlen,
                     char *port, size_t portlen, const char **why_r)
{
    const char *colon;

    if (addr[0] == '[') {
        const char *close_br = strchr(addr, ']');

        if (!close_br || close_br[1] != ':' || !close_br[2]) {
            *why_r = "bad address (want [v6addr]:port)";
            return -1;
        }
        snprintf(host, hostlen, "%.*s", (int)(close_br - addr - 1),
                 addr + 1);
        colon = close_br + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || colon == addr || !colon[1]) {
            *why_r = "bad address (want host:port)";
            return -1;
        }
        snprintf(host, hostlen, "%.*s", (int)(colon - addr), addr);
    }
    snprintf(port, portlen, "%s", colon + 1);
    return 0;
}

void net_dial_host(const char *addr, char *out, size_t outlen)
{
    char port[32];
    const char *why;

    if (outlen == 0)
        return;
    out[0] = '\0';
    if (addr[0] == '/' ||
        net_split(addr, out, outlen, port, sizeof(port), &why) != 0)
        out[0] = '\0';
}

int net_dial(const char *addr, int timeout, const char **why_r)
{
    char host[256], port[32];
    struct addrinfo hints, *res = NULL, *ai;
    int fd = -1, r, err = ECONNREFUSED;

    if (addr[0] == '/') {
        struct sockaddr_un sun;

        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(addr) >= sizeof(sun.sun_path)) {
            *why_r = "socket path too long";
            return -1;
        }
        memcpy(sun.sun_path, addr, strlen(addr) + 1);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || net_connect_fd(fd, (struct sockaddr *)&sun,
                                     sizeof(sun), timeout) != 0) {
            err = errno;
            *why_r = strerror(err);
            if (fd >= 0)
                close(fd);
            errno = err;
            return -1;
        }
        return fd;
    }
    if (net_split(addr, host, sizeof(host), port, sizeof(port), why_r) != 0)
        return -1;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    r = getaddrinfo(host, port, &hints, &res);
    if (r != 0) {
        *why_r = gai_strerror(r);
        return -1;
    }
    *why_r = "no address";
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            *why_r = strerror(err);
            continue;
        }
        if (net_connect_fd(fd, ai->ai_addr, ai->ai_addrlen, timeout) == 0)
            break;
        err = errno;
        *why_r = strerror(err);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        errno = err;
    return fd;
}

/*
 * fakehosts.c - a preload library for the imapd tests: getnameinfo()
 * answers from a file instead of the resolver, so that a test can give
 * loopback addresses (127.0.0.2, 127.0.0.3, ...) host names in domains of
 * its own without touching /etc/hosts.
 *
 *   LD_PRELOAD=.../fakehosts.so FAKEHOSTS_FILE=hosts imapd ...
 *
 * The file holds lines "ADDRESS NAME" (IPv4 dotted quad); an IPv4
 * address listed there gets NAME, one not listed fails with EAI_NONAME
 * when NI_NAMEREQD is given (as an address without a name does), and
 * every other call goes to the real getnameinfo().
 */
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*getnameinfo_fn)(const struct sockaddr *, socklen_t, char *,
                              socklen_t, char *, socklen_t, int);

int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host,
                socklen_t hostlen, char *serv, socklen_t servlen, int flags)
{
    const char *path = getenv("FAKEHOSTS_FILE");
    getnameinfo_fn real;

    if (path && sa && sa->sa_family == AF_INET && host) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        char want[INET_ADDRSTRLEN], line[512], addr[64], name[400];
        FILE *f = fopen(path, "r");

        if (f && inet_ntop(AF_INET, &sin->sin_addr, want, sizeof(want))) {
            while (fgets(line, sizeof(line), f)) {
                if (sscanf(line, "%63s %399s", addr, name) != 2 ||
                    strcmp(addr, want) != 0)
                    continue;
                fclose(f);
                if (strlen(name) >= hostlen)
                    return EAI_OVERFLOW;
                strcpy(host, name);
                if (serv && servlen)
                    snprintf(serv, servlen, "%u",
                             (unsigned)ntohs(sin->sin_port));
                return 0;
            }
        }
        if (f)
            fclose(f);
        if (flags & NI_NAMEREQD)
            return EAI_NONAME;
    }
    real = (getnameinfo_fn)(void (*)(void))dlsym(RTLD_NEXT, "getnameinfo");
    if (!real)
        return EAI_FAIL;
    return real(sa, salen, host, hostlen, serv, servlen, flags);
}

/*
 * received.c - the queue id of the topmost Received field (received.h).
 *
 * The header is walked line by line over (pointer, length): the first
 * line that starts a field named Received (not a continuation line)
 * begins the field, which goes on while the next line starts with a
 * space or tab.  In it the word "id" standing alone (white space or the
 * field's start before it, white space after it) is followed by the
 * token.  Comments are not parsed: "(id x)" is not an id clause because
 * "(id" is no word of its own.
 */
#include "config.h"

#include <string.h>
#include <strings.h>

#include "lmtpd/received.h"

static int received_is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int received_qid_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || (c && strchr("._-+=@/", c) != NULL);
}

/* The end of the line starting at i (the index after its LF, or len). */
static size_t received_line_end(const char *h, size_t len, size_t i)
{
    while (i < len && h[i] != '\n')
        i++;
    return i < len ? i + 1 : len;
}

int received_queue_id(const char *hdr, size_t len, char *out,
                      size_t outsize)
{
    size_t i = 0, start = 0, end = 0, n = 0;
    int found = 0;

    out[0] = '\0';
    /* the topmost Received field: [start, end) */
    while (i < len) {
        size_t next = received_line_end(hdr, len, i);

        if (hdr[i] == '\r' || hdr[i] == '\n')
            return 0;                   /* the end of the header */
        if (next - i >= 9 && strncasecmp(hdr + i, "Received:", 9) == 0) {
            start = i + 9;
            end = next;
            while (end < len && (hdr[end] == ' ' || hdr[end] == '\t'))
                end = received_line_end(hdr, len, end);
            found = 1;
            break;
        }
        i = next;
    }
    if (!found)
        return 0;
    for (i = start; i + 2 < end; i++) {
        if ((hdr[i] != 'i' && hdr[i] != 'I') ||
            (hdr[i + 1] != 'd' && hdr[i + 1] != 'D') ||
            !received_is_ws(hdr[i + 2]) ||
            (i > start && !received_is_ws(hdr[i - 1])))
            continue;
        i += 2;
        while (i < end && received_is_ws(hdr[i]))
            i++;
        while (i < end && received_qid_char(hdr[i]) &&
               n < RECEIVED_QID_MAX && n + 1 < outsize)
            out[n++] = hdr[i++];
        out[n] = '\0';
        return n > 0;
    }
    return 0;
}

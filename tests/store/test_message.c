/*
 * test_message.c - the FETCH read side of a stored message
 * (store/message.c): ENVELOPE, BODY, BODYSTRUCTURE and BODY[section]
 * answers for real messages written here (CRLF line ends, Return-Path and
 * Received first, as lmtpd stores them), compared with exact expected
 * strings; malformed MIME; the nesting and part-count bounds; and a
 * fuzz-ish loop over truncated and mutated inputs, each copied into a
 * buffer of exactly its size so that the sanitizer build catches any read
 * past the end.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lib/buf.h"
#include "store/message.h"
#include "tests/testhelp.h"

/* ---- helpers ---- */

static struct message *parse(const char *text)
{
    struct message *m = (struct message *)0x1;
    assert_int_equal(message_parse(text, strlen(text), &m), MESSAGE_OK);
    assert_non_null(m);
    return m;
}

static void check_envelope(const struct message *m, const char *want)
{
    struct buf out = BUF_INITIALIZER;
    buf_setcstr(&out, "X");             /* output is appended */
    assert_int_equal(message_write_envelope(m, &out), MESSAGE_OK);
    assert_string_equal(buf_cstring(&out) + 1, want);
    buf_free(&out);
}

static void check_body(const struct message *m, int ext, const char *want)
{
    struct buf out = BUF_INITIALIZER;
    assert_int_equal(message_write_body(m, ext, &out), MESSAGE_OK);
    assert_string_equal(buf_cstring(&out), want);
    buf_free(&out);
}

/* Section by text: "1.2" numbers then kind; fields as a NULL-terminated
 * vararg list. */
static void check_section(const struct message *m, const char *nums,
                          enum message_section_kind kind, const char *want,
                          ...)
{
    uint32_t part[16];
    const char *fields[16];
    size_t npart = 0, nfields = 0;
    struct message_section sec;
    struct buf out = BUF_INITIALIZER;
    const char *p = nums;
    va_list ap;

    while (*p) {
        part[npart++] = (uint32_t)strtoul(p, (char **)&p, 10);
        if (*p == '.')
            p++;
    }
    va_start(ap, want);
    for (;;) {
        const char *f = va_arg(ap, const char *);
        if (f == NULL)
            break;
        fields[nfields++] = f;
    }
    va_end(ap);
    memset(&sec, 0, sizeof(sec));
    sec.part = part;
    sec.npart = npart;
    sec.kind = kind;
    sec.fields = fields;
    sec.nfields = nfields;
    buf_setcstr(&out, "poison");
    buf_reset(&out);
    assert_int_equal(message_get_section(m, &sec, &out), MESSAGE_OK);
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.s ? out.s : "", want, out.len);
    buf_free(&out);
}

#define HDR_DELIVERY \
    "Return-Path: <alice@example.org>\r\n" \
    "Received: from mx.example.org by imap.example.net with LMTP\r\n" \
    "\tid 42; Sat, 21 Nov 2026 10:00:00 +0000\r\n"

/* ---- simple text message ---- */

static const char simple_msg[] =
    HDR_DELIVERY
    "Date: Sat, 21 Nov 2026 09:59:58 +0100\r\n"
    "From: Alice Example <alice@example.org>\r\n"
    "To: bob@example.net, \"Carol, C.\" <carol@example.net>\r\n"
    "Subject: Lunch\r\n"
    " tomorrow?\r\n"
    "Message-ID: <m1@example.org>\r\n"
    "\r\n"
    "Hi Bob,\r\n"
    "noon?\r\n";

static void test_simple(void **state)
{
    struct message *m = parse(simple_msg);
    size_t hdr = strstr(simple_msg, "\r\n\r\n") + 4 - simple_msg;
    (void)state;

    assert_int_equal(message_size(m), strlen(simple_msg));
    assert_int_equal(message_header_size(m), hdr);
    assert_int_equal(message_part_count(m), 1);
    check_envelope(m,
        "(\"Sat, 21 Nov 2026 09:59:58 +0100\" \"Lunch tomorrow?\" "
        "((\"Alice Example\" NIL \"alice\" \"example.org\")) "
        "((\"Alice Example\" NIL \"alice\" \"example.org\")) "
        "((\"Alice Example\" NIL \"alice\" \"example.org\")) "
        "((NIL NIL \"bob\" \"example.net\")"
        "(\"Carol, C.\" NIL \"carol\" \"example.net\")) "
        "NIL NIL NIL \"<m1@example.org>\")");
    check_body(m, 1,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" "
        "16 2 NIL NIL NIL NIL)");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" "
        "16 2)");
    check_section(m, "", MESSAGE_SECTION_CONTENT, simple_msg, NULL);
    check_section(m, "", MESSAGE_SECTION_TEXT, "Hi Bob,\r\nnoon?\r\n", NULL);
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "Hi Bob,\r\nnoon?\r\n",
                  NULL);
    check_section(m, "2", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "1.1", MESSAGE_SECTION_CONTENT, "", NULL);
    {
        char want[sizeof(simple_msg)];
        memcpy(want, simple_msg, hdr);
        want[hdr] = '\0';
        check_section(m, "", MESSAGE_SECTION_HEADER, want, NULL);
    }
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS,
                  "From: Alice Example <alice@example.org>\r\n"
                  "Subject: Lunch\r\n tomorrow?\r\n\r\n", "from", "SUBJECT", "x-none",
                  NULL);
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS, "\r\n", "x-none",
                  NULL);
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS_NOT,
                  "Date: Sat, 21 Nov 2026 09:59:58 +0100\r\n"
                  "From: Alice Example <alice@example.org>\r\n"
                  "To: bob@example.net, \"Carol, C.\" <carol@example.net>\r\n"
                  "Subject: Lunch\r\n tomorrow?\r\n"
                  "Message-ID: <m1@example.org>\r\n\r\n",
                  "return-path", "Received", NULL);
    message_free(&m);
    assert_null(m);
    message_free(&m);
}

/* ---- NUL octets: 0x80 in a literal, kept by message_get_section ---- */

static void test_nul_in_literal(void **state)
{
    static const char raw[] = "Subject: n\0l\r\n\r\nab\0c\0\r\n";
    struct message *m = NULL;
    struct message_section sec;
    struct buf out = BUF_INITIALIZER;
    (void)state;

    assert_int_equal(message_parse(raw, sizeof(raw) - 1, &m), MESSAGE_OK);
    memset(&sec, 0, sizeof(sec));
    sec.kind = MESSAGE_SECTION_TEXT;
    assert_int_equal(message_write_section(m, &sec, 0, SIZE_MAX, &out), 0);
    assert_int_equal(out.len, 5 + 7);
    assert_memory_equal(out.s, "{7}\r\nab\x80" "c\x80\r\n", 12);
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 3, 2, &out), 0);
    assert_memory_equal(out.s, "{2}\r\nc\x80", 7);
    buf_reset(&out);
    sec.kind = MESSAGE_SECTION_CONTENT;
    assert_int_equal(message_write_section(m, &sec, 0, SIZE_MAX, &out), 0);
    assert_int_equal(out.len, 6 + sizeof(raw) - 1);
    assert_null(memchr(out.s, '\0', out.len));
    assert_memory_equal(out.s, "{23}\r\nSubject: n\x80l\r\n", 20);
    buf_reset(&out);
    assert_int_equal(message_get_section(m, &sec, &out), 0);
    assert_int_equal(out.len, sizeof(raw) - 1);
    assert_memory_equal(out.s, raw, sizeof(raw) - 1);
    buf_free(&out);
    message_free(&m);
}

/* ---- partial fetches ---- */

static void test_partial(void **state)
{
    struct message *m = parse(simple_msg);
    struct message_section sec;
    struct buf out = BUF_INITIALIZER;
    (void)state;

    memset(&sec, 0, sizeof(sec));
    sec.kind = MESSAGE_SECTION_TEXT;
    assert_int_equal(message_write_section(m, &sec, 0, SIZE_MAX, &out), 0);
    assert_string_equal(buf_cstring(&out), "{16}\r\nHi Bob,\r\nnoon?\r\n");
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 3, 4, &out), 0);
    assert_string_equal(buf_cstring(&out), "{4}\r\nBob,");
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 10, 100, &out), 0);
    assert_string_equal(buf_cstring(&out), "{6}\r\noon?\r\n");
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 16, 10, &out), 0);
    assert_string_equal(buf_cstring(&out), "{0}\r\n");
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 1000, 10, &out), 0);
    assert_string_equal(buf_cstring(&out), "{0}\r\n");
    buf_reset(&out);
    assert_int_equal(message_write_section(m, &sec, 0, 0, &out), 0);
    assert_string_equal(buf_cstring(&out), "{0}\r\n");
    /* bad arguments */
    sec.kind = MESSAGE_SECTION_MIME;
    assert_int_equal(message_get_section(m, &sec, &out), MESSAGE_BADARG);
    sec.kind = (enum message_section_kind)99;
    assert_int_equal(message_get_section(m, &sec, &out), MESSAGE_BADARG);
    buf_free(&out);
    message_free(&m);
}

/* ---- multipart/alternative ---- */

static const char alt_msg[] =
    HDR_DELIVERY
    "From: alice@example.org\r\n"
    "To: bob@example.net\r\n"
    "Subject: alt\r\n"
    "MIME-Version: 1.0\r\n"
    "Content-Type: multipart/alternative; boundary=\"b1 x\"\r\n"
    "\r\n"
    "preamble\r\n"
    "--b1 x\r\n"
    "Content-Type: text/plain; charset=utf-8; format=flowed\r\n"
    "Content-Transfer-Encoding: quoted-printable\r\n"
    "\r\n"
    "plain =C3=A9\r\n"
    "--b1 x\r\n"
    "Content-Type: text/html; charset=\"utf-8\"\r\n"
    "\r\n"
    "<p>html</p>\r\n"
    "<p>2</p>\r\n"
    "--b1 x--\r\n"
    "epilogue\r\n";

static void test_alternative(void **state)
{
    struct message *m = parse(alt_msg);
    (void)state;

    assert_int_equal(message_part_count(m), 3);
    check_body(m, 1,
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"utf-8\" \"FORMAT\" \"flowed\") "
        "NIL NIL \"QUOTED-PRINTABLE\" 12 1 NIL NIL NIL NIL)"
        "(\"TEXT\" \"HTML\" (\"CHARSET\" \"utf-8\") NIL NIL \"7BIT\" 21 2 "
        "NIL NIL NIL NIL) \"ALTERNATIVE\" (\"BOUNDARY\" \"b1 x\") NIL NIL "
        "NIL)");
    check_body(m, 0,
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"utf-8\" \"FORMAT\" \"flowed\") "
        "NIL NIL \"QUOTED-PRINTABLE\" 12 1)"
        "(\"TEXT\" \"HTML\" (\"CHARSET\" \"utf-8\") NIL NIL \"7BIT\" 21 2) "
        "\"ALTERNATIVE\")");
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "plain =C3=A9", NULL);
    check_section(m, "2", MESSAGE_SECTION_CONTENT,
                  "<p>html</p>\r\n<p>2</p>", NULL);
    check_section(m, "1", MESSAGE_SECTION_MIME,
                  "Content-Type: text/plain; charset=utf-8; format=flowed\r\n"
                  "Content-Transfer-Encoding: quoted-printable\r\n\r\n", NULL);
    check_section(m, "2", MESSAGE_SECTION_MIME,
                  "Content-Type: text/html; charset=\"utf-8\"\r\n\r\n", NULL);
    check_section(m, "3", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "0", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "1.1", MESSAGE_SECTION_CONTENT, "", NULL);
    /* HEADER of a part that is not message/rfc822: empty */
    check_section(m, "1", MESSAGE_SECTION_HEADER, "", NULL);
    check_section(m, "1", MESSAGE_SECTION_TEXT, "", NULL);
    check_section(m, "", MESSAGE_SECTION_TEXT,
                  strstr(alt_msg, "preamble"), NULL);
    message_free(&m);
}

/* ---- multipart/mixed with attachments ---- */

static const char mixed_msg[] =
    HDR_DELIVERY
    "From: \"Alice \\\"A\\\" Example\" <alice@example.org>\r\n"
    "Sender: secretary@example.org\r\n"
    "Reply-To: list@example.com\r\n"
    "To: bob@example.net\r\n"
    "Cc: Dave <dave@[192.0.2.1]>, eve@example.com (Eve E.)\r\n"
    "Bcc: <@relay.example:frank@example.org>\r\n"
    "In-Reply-To: <m1@example.org>\r\n"
    "Subject: report\r\n"
    "Date: Sun, 22 Nov 2026 08:00:00 +0000\r\n"
    "Message-ID: <m2@example.org>\r\n"
    "Content-Type: Multipart/Mixed; boundary=outer;\r\n"
    "  charset=us-ascii (comment)\r\n"
    "Content-Language: en, de\r\n"
    "\r\n"
    "--outer\r\n"
    "\r\n"
    "default typed part\r\n"
    "--outer\r\n"
    "Content-Type: application/pdf; name=\"r.pdf\"\r\n"
    "Content-Transfer-Encoding: base64\r\n"
    "Content-Disposition: attachment; filename=\"report 1.pdf\"; size=6\r\n"
    "Content-ID: <part2@example.org>\r\n"
    "Content-Description: the report\r\n"
    "Content-Location: http://example.org/r.pdf\r\n"
    "Content-Language: fr\r\n"
    "\r\n"
    "SGVsbG8h\r\n"
    "--outer\r\n"
    "Content-Type: image/png\r\n"
    "Content-Disposition: inline\r\n"
    "\r\n"
    "--outer--\r\n";

static void test_mixed(void **state)
{
    struct message *m = parse(mixed_msg);
    (void)state;

    assert_int_equal(message_part_count(m), 4);
    check_envelope(m,
        "(\"Sun, 22 Nov 2026 08:00:00 +0000\" \"report\" "
        "(({17}\r\nAlice \"A\" Example NIL \"alice\" \"example.org\")) "
        "((NIL NIL \"secretary\" \"example.org\")) "
        "((NIL NIL \"list\" \"example.com\")) "
        "((NIL NIL \"bob\" \"example.net\")) "
        "((\"Dave\" NIL \"dave\" \"[192.0.2.1]\")"
        "(\"Eve E.\" NIL \"eve\" \"example.com\")) "
        "((NIL \"@relay.example\" \"frank\" \"example.org\")) "
        "\"<m1@example.org>\" \"<m2@example.org>\")");
    check_body(m, 1,
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" "
        "18 1 NIL NIL NIL NIL)"
        "(\"APPLICATION\" \"PDF\" (\"NAME\" \"r.pdf\") "
        "\"<part2@example.org>\" \"the report\" \"BASE64\" 8 NIL "
        "(\"ATTACHMENT\" (\"FILENAME\" \"report 1.pdf\" \"SIZE\" \"6\")) "
        "(\"fr\") \"http://example.org/r.pdf\")"
        "(\"IMAGE\" \"PNG\" NIL NIL NIL \"7BIT\" 0 NIL (\"INLINE\" NIL) NIL "
        "NIL) \"MIXED\" (\"BOUNDARY\" \"outer\" \"CHARSET\" \"us-ascii\") "
        "NIL (\"en\" \"de\") NIL)");
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "default typed part",
                  NULL);
    check_section(m, "1", MESSAGE_SECTION_MIME, "\r\n", NULL);
    check_section(m, "2", MESSAGE_SECTION_CONTENT, "SGVsbG8h", NULL);
    check_section(m, "3", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "4", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS,
                  "Cc: Dave <dave@[192.0.2.1]>, eve@example.com (Eve E.)\r\n"
                  "Content-Language: en, de\r\n\r\n",
                  "content-language", "CC", NULL);
    message_free(&m);
}

/* ---- nested message/rfc822 ---- */

static const char nested_msg[] =
    HDR_DELIVERY
    "From: alice@example.org\r\n"
    "Subject: fwd\r\n"
    "Content-Type: multipart/mixed; boundary=\"=_a\"\r\n"
    "\r\n"
    "--=_a\r\n"
    "Content-Type: text/plain\r\n"
    "\r\n"
    "see attached\r\n"
    "--=_a\r\n"
    "Content-Type: message/rfc822\r\n"
    "\r\n"
    "From: Bob <bob@example.net>\r\n"
    "Subject: inner\r\n"
    "Content-Type: multipart/alternative; boundary=\"=_b\"\r\n"
    "\r\n"
    "--=_b\r\n"
    "\r\n"
    "inner text\r\n"
    "--=_b\r\n"
    "Content-Type: message/rfc822\r\n"
    "\r\n"
    "Subject: innermost\r\n"
    "\r\n"
    "deep\r\n"
    "--=_b--\r\n"
    "--=_a--\r\n";

static const char nested_inner[] =
    "From: Bob <bob@example.net>\r\n"
    "Subject: inner\r\n"
    "Content-Type: multipart/alternative; boundary=\"=_b\"\r\n"
    "\r\n"
    "--=_b\r\n"
    "\r\n"
    "inner text\r\n"
    "--=_b\r\n"
    "Content-Type: message/rfc822\r\n"
    "\r\n"
    "Subject: innermost\r\n"
    "\r\n"
    "deep\r\n"
    "--=_b--";

static void test_nested(void **state)
{
    struct message *m = parse(nested_msg);
    char want[512];
    (void)state;

    assert_int_equal(message_part_count(m), 7);
    snprintf(want, sizeof(want),
        "((\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 12 1)"
        "(\"MESSAGE\" \"RFC822\" NIL NIL NIL \"7BIT\" %zu "
        "(NIL \"inner\" ((\"Bob\" NIL \"bob\" \"example.net\")) "
        "((\"Bob\" NIL \"bob\" \"example.net\")) "
        "((\"Bob\" NIL \"bob\" \"example.net\")) NIL NIL NIL NIL NIL) "
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" "
        "10 1)"
        "(\"MESSAGE\" \"RFC822\" NIL NIL NIL \"7BIT\" 26 "
        "(NIL \"innermost\" NIL NIL NIL NIL NIL NIL NIL NIL) "
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 4 1) "
        "3) \"ALTERNATIVE\") 14) \"MIXED\")",
        strlen(nested_inner));
    check_body(m, 0, want);
    check_section(m, "2", MESSAGE_SECTION_CONTENT, nested_inner, NULL);
    check_section(m, "2", MESSAGE_SECTION_MIME,
                  "Content-Type: message/rfc822\r\n\r\n", NULL);
    check_section(m, "2", MESSAGE_SECTION_HEADER,
                  "From: Bob <bob@example.net>\r\n"
                  "Subject: inner\r\n"
                  "Content-Type: multipart/alternative; boundary=\"=_b\"\r\n"
                  "\r\n", NULL);
    check_section(m, "2", MESSAGE_SECTION_HEADER_FIELDS,
                  "\r\n", "nothing", NULL);
    check_section(m, "2", MESSAGE_SECTION_HEADER_FIELDS,
                  "Subject: inner\r\n\r\n", "subject", NULL);
    check_section(m, "2", MESSAGE_SECTION_TEXT,
                  strstr(nested_inner, "--=_b\r\n"), NULL);
    check_section(m, "2.1", MESSAGE_SECTION_CONTENT, "inner text", NULL);
    check_section(m, "2.1", MESSAGE_SECTION_MIME, "\r\n", NULL);
    check_section(m, "2.2", MESSAGE_SECTION_CONTENT,
                  "Subject: innermost\r\n\r\ndeep", NULL);
    check_section(m, "2.2", MESSAGE_SECTION_HEADER,
                  "Subject: innermost\r\n\r\n", NULL);
    check_section(m, "2.2", MESSAGE_SECTION_TEXT, "deep", NULL);
    check_section(m, "2.2.1", MESSAGE_SECTION_CONTENT, "deep", NULL);
    check_section(m, "2.2.1", MESSAGE_SECTION_MIME,
                  "Subject: innermost\r\n\r\n", NULL);
    check_section(m, "2.2.2", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "2.3", MESSAGE_SECTION_CONTENT, "", NULL);
    check_section(m, "1.1", MESSAGE_SECTION_CONTENT, "", NULL);
    message_free(&m);
}

/* ---- address groups, odd addresses, 8-bit headers ---- */

static void test_groups(void **state)
{
    struct message *m = parse(
        HDR_DELIVERY
        "From: Team: alice@example.org, Bob <bob@example.net>;, "
        "carol@example.net\r\n"
        "Sender: \r\n"
        "To: undisclosed-recipients:;\r\n"
        "Cc: postmaster, \"q\\\\uoted\"@example.org\r\n"
        "Bcc: Open: dave@example.org\r\n"
        "Subject: \r\n"
        "\r\n"
        "x\r\n");
    (void)state;

    check_envelope(m,
        "(NIL \"\" "
        "((NIL NIL \"Team\" NIL)(NIL NIL \"alice\" \"example.org\")"
        "(\"Bob\" NIL \"bob\" \"example.net\")(NIL NIL NIL NIL)"
        "(NIL NIL \"carol\" \"example.net\")) "
        "((NIL NIL \"Team\" NIL)(NIL NIL \"alice\" \"example.org\")"
        "(\"Bob\" NIL \"bob\" \"example.net\")(NIL NIL NIL NIL)"
        "(NIL NIL \"carol\" \"example.net\")) "
        "((NIL NIL \"Team\" NIL)(NIL NIL \"alice\" \"example.org\")"
        "(\"Bob\" NIL \"bob\" \"example.net\")(NIL NIL NIL NIL)"
        "(NIL NIL \"carol\" \"example.net\")) "
        "((NIL NIL \"undisclosed-recipients\" NIL)(NIL NIL NIL NIL)) "
        "((NIL NIL \"postmaster\" \"\")"
        "(NIL NIL {10}\r\n\"q\\\\uoted\" \"example.org\")) "
        "((NIL NIL \"Open\" NIL)(NIL NIL \"dave\" \"example.org\")"
        "(NIL NIL NIL NIL)) "
        "NIL NIL)");
    message_free(&m);
}

/* message_addresses(): each address reported as name, mailbox, host; a
 * folded value (CR, LF, a NUL) read as unfolded; a list of more tokens
 * than the parser keeps inline (100 addresses) reported whole */
static int addr_collect(void *rock, const char *name, size_t namelen,
                        const char *mailbox, size_t mailboxlen,
                        const char *host, size_t hostlen)
{
    struct buf *out = rock;

    buf_printf(out, "[%.*s|%.*s|%.*s]", (int)namelen, name ? name : "",
               (int)mailboxlen, mailbox, (int)hostlen, host);
    return 0;
}

static void check_addresses(const char *value, size_t len, const char *want)
{
    struct buf out = BUF_INITIALIZER;

    assert_int_equal(message_addresses(value, len, addr_collect, &out),
                     MESSAGE_OK);
    assert_string_equal(buf_cstring(&out), want);
    buf_free(&out);
}

static void test_addresses(void **state)
{
    static const char folded[] = " Bob\r\n <bob@exa\0mple.net>,\r\n\tcarol@example.net";
    struct buf list = BUF_INITIALIZER, want = BUF_INITIALIZER;
    int i;

    (void)state;
    check_addresses("", 0, "");
    check_addresses(" \"A. Person\" <a.person@example.org> (home)", 42,
                    "[A. Person|a.person|example.org]");
    check_addresses(folded, sizeof(folded) - 1,
                    "[Bob|bob|example.net][|carol|example.net]");
    check_addresses("Team: alice@example.org, Bob <bob@example.net>;", 47,
                    "[|alice|example.org][Bob|bob|example.net]");
    for (i = 0; i < 100; i++) {
        buf_printf(&list, "%sU%d <u%d@h%d.example>", i ? ", " : "", i, i, i);
        buf_printf(&want, "[U%d|u%d|h%d.example]", i, i, i);
    }
    check_addresses(list.s, list.len, buf_cstring(&want));
    buf_free(&list);
    buf_free(&want);
}

static void test_8bit(void **state)
{
    struct message *m = parse(
        HDR_DELIVERY
        "From: J\xc3\xbcrgen <j@example.de>\r\n"
        "Subject: =?utf-8?q?gr=C3=BC=C3=9Fe?= and caf\xc3\xa9\r\n"
        "Message-ID: <a\"b@x>\r\n"
        "Content-Type: text/plain; name=\"caf\xc3\xa9.txt\"\r\n"
        "\r\n"
        "body");
    (void)state;

    check_envelope(m,
        "(NIL {37}\r\n=?utf-8?q?gr=C3=BC=C3=9Fe?= and caf\xc3\xa9 "
        "(({7}\r\nJ\xc3\xbcrgen NIL \"j\" \"example.de\")) "
        "(({7}\r\nJ\xc3\xbcrgen NIL \"j\" \"example.de\")) "
        "(({7}\r\nJ\xc3\xbcrgen NIL \"j\" \"example.de\")) "
        "NIL NIL NIL NIL {7}\r\n<a\"b@x>)");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"NAME\" {9}\r\ncaf\xc3\xa9.txt) NIL NIL "
        "\"7BIT\" 4 1)");
    message_free(&m);
}

/* ---- multipart/digest: parts default to message/rfc822 ---- */

static void test_digest(void **state)
{
    struct message *m = parse(
        "Content-Type: multipart/digest; boundary=d\r\n\r\n"
        "--d\r\n\r\nSubject: one\r\n\r\nfirst\r\n"
        "--d\r\nContent-Type: text/plain\r\n\r\nplain\r\n--d--\r\n");
    (void)state;

    check_body(m, 0,
        "((\"MESSAGE\" \"RFC822\" NIL NIL NIL \"7BIT\" 21 "
        "(NIL \"one\" NIL NIL NIL NIL NIL NIL NIL NIL) "
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 5 1) "
        "3)(\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 5 1) \"DIGEST\")");
    check_section(m, "1.1", MESSAGE_SECTION_CONTENT, "first", NULL);
    check_section(m, "1", MESSAGE_SECTION_HEADER, "Subject: one\r\n\r\n",
                  NULL);
    message_free(&m);
}

/* ---- malformed MIME ---- */

static void test_malformed(void **state)
{
    struct message *m;
    (void)state;

    /* no close delimiter: the last part runs to the end */
    m = parse("Content-Type: multipart/mixed; boundary=zz\r\n\r\n"
              "--zz\r\n\r\none\r\n--zz\r\nContent-Type: text/x-a\r\n\r\n"
              "two\r\nmore");
    check_body(m, 0,
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 3 1)"
        "(\"TEXT\" \"X-A\" NIL NIL NIL \"7BIT\" 9 2) \"MIXED\")");
    check_section(m, "2", MESSAGE_SECTION_CONTENT, "two\r\nmore", NULL);
    message_free(&m);

    /* unparsable Content-Type: text/plain us-ascii */
    m = parse("Content-Type: garbage\r\nContent-Transfer-Encoding: \r\n\r\n"
              "x\r\n");
    check_body(m, 1,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 3 1 "
        "NIL NIL NIL NIL)");
    message_free(&m);
    m = parse("Content-Type: /plain\r\n\r\n");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 0 0)");
    message_free(&m);
    /* a broken parameter ends the list; what came before stays */
    m = parse("Content-Type: text/plain; a=1; b; c=3\r\n\r\n");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"A\" \"1\") NIL NIL \"7BIT\" 0 0)");
    message_free(&m);

    /* multipart without boundary parameter: text/plain */
    m = parse("Content-Type: multipart/mixed\r\n\r\n--x\r\n\r\ny\r\n--x--\r\n");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 17 4)");
    message_free(&m);

    /* boundary never found: one empty text/plain part */
    m = parse("Content-Type: multipart/mixed; boundary=nope\r\n\r\nhello\r\n");
    check_body(m, 1,
        "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 0 0 "
        "NIL NIL NIL NIL) \"MIXED\" (\"BOUNDARY\" \"nope\") NIL NIL NIL)");
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "", NULL);
    message_free(&m);

    /* no header/body separator: all header, empty body */
    m = parse("Subject: only header\r\nFrom: a@b");
    assert_int_equal(message_header_size(m), 31);
    check_envelope(m, "(NIL \"only header\" ((NIL NIL \"a\" \"b\")) "
                   "((NIL NIL \"a\" \"b\")) ((NIL NIL \"a\" \"b\")) "
                   "NIL NIL NIL NIL NIL)");
    check_section(m, "", MESSAGE_SECTION_TEXT, "", NULL);
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS,
                  "From: a@b\r\n\r\n", "from", NULL);
    message_free(&m);

    /* bare LF line ends */
    m = parse("Subject: lf\nContent-Type: multipart/mixed; boundary=q\n\n"
              "--q\nContent-Type: text/plain\n\na\nb\n--q--\n");
    check_body(m, 0, "((\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 3 2) \"MIXED\")");
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "a\nb", NULL);
    check_section(m, "", MESSAGE_SECTION_HEADER_FIELDS, "Subject: lf\n\r\n",
                  "subject", NULL);
    message_free(&m);

    /* a boundary that is a prefix of another line is not a delimiter */
    m = parse("Content-Type: multipart/mixed; boundary=a\r\n\r\n"
              "--a\r\n\r\n--ab\r\n--a--\r\n");
    check_section(m, "1", MESSAGE_SECTION_CONTENT, "--ab", NULL);
    message_free(&m);

    /* empty input */
    assert_int_equal(message_parse(NULL, 0, &m), MESSAGE_OK);
    check_envelope(m, "(NIL NIL NIL NIL NIL NIL NIL NIL NIL NIL)");
    check_body(m, 0,
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\") NIL NIL \"7BIT\" 0 0)");
    check_section(m, "", MESSAGE_SECTION_CONTENT, "", NULL);
    message_free(&m);
}

/* ---- bounds: nesting depth, part count ---- */

static void test_limits(void **state)
{
    struct buf text = BUF_INITIALIZER, out = BUF_INITIALIZER;
    struct message *m;
    int i;
    (void)state;

    /* 200 levels of message/rfc822 */
    for (i = 0; i < 200; i++)
        buf_appendcstr(&text, "Content-Type: message/rfc822\r\n\r\n");
    buf_appendcstr(&text, "core\r\n");
    assert_int_equal(message_parse(text.s, text.len, &m), MESSAGE_OK);
    assert_int_equal(message_part_count(m), MESSAGE_MAX_DEPTH + 1);
    assert_int_equal(message_write_body(m, 1, &out), MESSAGE_OK);
    assert_non_null(strstr(buf_cstring(&out), "(\"TEXT\" \"PLAIN\""));
    message_free(&m);

    /* 200 levels of multipart */
    buf_reset(&text);
    for (i = 0; i < 200; i++)
        buf_printf(&text, "Content-Type: multipart/mixed; boundary=b%d\r\n"
                   "\r\n--b%d\r\n", i, i);
    buf_appendcstr(&text, "\r\ncore\r\n");
    assert_int_equal(message_parse(text.s, text.len, &m), MESSAGE_OK);
    assert_int_equal(message_part_count(m), MESSAGE_MAX_DEPTH + 1);
    buf_reset(&out);
    assert_int_equal(message_write_body(m, 1, &out), MESSAGE_OK);
    message_free(&m);

    /* 30,000 parts in one multipart */
    buf_reset(&text);
    buf_appendcstr(&text, "Content-Type: multipart/mixed; boundary=p\r\n\r\n");
    for (i = 0; i < 30000; i++)
        buf_appendcstr(&text, "--p\r\n\r\nx\r\n");
    buf_appendcstr(&text, "--p--\r\n");
    assert_int_equal(message_parse(text.s, text.len, &m), MESSAGE_OK);
    assert_int_equal(message_part_count(m), MESSAGE_MAX_PARTS);
    check_section(m, "9999", MESSAGE_SECTION_CONTENT, "x", NULL);
    check_section(m, "10000", MESSAGE_SECTION_CONTENT, "", NULL);
    message_free(&m);

    /* an address list of many tokens */
    buf_reset(&text);
    buf_appendcstr(&text, "To: ");
    for (i = 0; i < 3000; i++)
        buf_printf(&text, "u%d@example.org, ", i);
    buf_appendcstr(&text, "\r\n\r\n");
    assert_int_equal(message_parse(text.s, text.len, &m), MESSAGE_OK);
    buf_reset(&out);
    assert_int_equal(message_write_envelope(m, &out), MESSAGE_OK);
    assert_non_null(strstr(buf_cstring(&out),
                           "(NIL NIL \"u2999\" \"example.org\"))"));
    message_free(&m);

    /* output buffer at its maximum: MESSAGE_NOMEM, no crash */
    m = parse(nested_msg);
    buf_reset(&out);
    buf_set_max(&out, 40);
    assert_int_equal(message_write_body(m, 1, &out), MESSAGE_NOMEM);
    buf_reset(&out);
    assert_int_equal(message_write_envelope(m, &out), MESSAGE_NOMEM);
    message_free(&m);
    buf_free(&out);
    buf_free(&text);
}

/* ---- BINARY (RFC 3516) ---- */

static void check_binary(const struct message *m, const char *nums,
                         int want_r, int want_exists, const char *want,
                         size_t want_len)
{
    uint32_t part[16];
    size_t n = 0;
    int exists = -1;
    struct buf out = BUF_INITIALIZER;
    const char *p = nums;

    while (*p) {
        part[n++] = (uint32_t)strtoul(p, (char **)&p, 10);
        if (*p == '.')
            p++;
    }
    buf_setcstr(&out, "X");             /* output is appended */
    assert_int_equal(message_get_binary(m, part, n, &out, &exists), want_r);
    assert_int_equal(exists, want_exists);
    assert_int_equal(out.len, 1 + want_len);
    assert_memory_equal(out.s + 1, want, want_len);
    buf_free(&out);
}

static void test_binary(void **state)
{
    static const char msg[] =
        "From: a@b\r\nMIME-Version: 1.0\r\n"
        "Content-Type: multipart/mixed; boundary=\"x\"\r\n\r\n"
        "--x\r\nContent-Transfer-Encoding: Base64 (comment)\r\n\r\n"
        "AAEC\r\n/w==\r\n"
        "--x\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n"
        "a=3Db  \r\nc=\r\nd =20\t\r\n=4x=\r\n"
        "--x\r\nContent-Transfer-Encoding: x-gzip\r\n\r\nzz\r\n"
        "--x\r\nContent-Type: message/rfc822\r\n"
        "Content-Transfer-Encoding: base64\r\n\r\nSubject: s\r\n\r\nb\r\n"
        "--x\r\nContent-Type: message/rfc822\r\n"
        "Content-Transfer-Encoding: 8BIT\r\n\r\nSubject: t\r\n\r\nbody\r\n"
        "--x\r\nContent-Transfer-Encoding:\r\n\r\nplain\r\n"
        "--x--\r\n";
    struct message *m = parse(msg);
    struct buf out = BUF_INITIALIZER;
    (void)state;

    check_binary(m, "1", MESSAGE_OK, 1, "\0\1\2\377", 4);
    check_binary(m, "2", MESSAGE_OK, 1, "a=b\r\ncd  \r\n=4x", 14);
    check_binary(m, "3", MESSAGE_UNKNOWN_CTE, 1, "", 0);
    /* a message/rfc822 part: only identity encodings */
    check_binary(m, "4", MESSAGE_UNKNOWN_CTE, 1, "", 0);
    check_binary(m, "5", MESSAGE_OK, 1, "Subject: t\r\n\r\nbody", 18);
    check_binary(m, "5.1", MESSAGE_OK, 1, "body", 4);
    check_binary(m, "6", MESSAGE_OK, 1, "plain", 5);
    check_binary(m, "7", MESSAGE_OK, 0, "", 0);
    check_binary(m, "1.1", MESSAGE_OK, 0, "", 0);
    check_binary(m, "", MESSAGE_OK, 1, msg, sizeof(msg) - 1);
    assert_int_equal(message_get_binary(NULL, NULL, 0, &out, NULL),
                     MESSAGE_BADARG);
    assert_int_equal(message_get_binary(m, NULL, 1, &out, NULL),
                     MESSAGE_BADARG);
    message_free(&m);

    /* the decoders on their own: base64 skips what is not in the
     * alphabet and stops at '='; a quantum cut short is dropped */
    assert_int_equal(message_decode_base64("Zm9v\nYm Fy!YQ", 14, &out),
                     MESSAGE_OK);
    assert_int_equal(out.len, 7);
    assert_memory_equal(out.s, "foobara", 7);
    buf_reset(&out);
    assert_int_equal(message_decode_qp("x=\n=41 \ny=", 10, &out), MESSAGE_OK);
    assert_int_equal(out.len, 4);
    assert_memory_equal(out.s, "xA\ny", 4);
    buf_reset(&out);
    assert_int_equal(message_decode_qp("t =\r\n  ", 7, &out), MESSAGE_OK);
    assert_int_equal(out.len, 2);
    assert_memory_equal(out.s, "t ", 2);
    buf_free(&out);
}

/* ---- fuzz-ish: truncations and mutations ---- */

static void exercise(const char *data, size_t len)
{
    static const char *const fields[] = { "subject", "content-type" };
    static const uint32_t paths[][3] = {
        { 1, 0, 0 }, { 2, 0, 0 }, { 2, 1, 0 }, { 2, 2, 0 }, { 2, 2, 1 },
        { 3, 1, 1 }, { 1, 1, 1 }
    };
    char *copy = malloc(len ? len : 1);
    struct message *m;
    struct buf out = BUF_INITIALIZER;
    struct message_section sec;
    size_t p, k;

    assert_non_null(copy);
    memcpy(copy, data, len);
    assert_int_equal(message_parse(copy, len, &m), MESSAGE_OK);
    assert_int_equal(message_write_envelope(m, &out), MESSAGE_OK);
    assert_int_equal(message_write_body(m, 0, &out), MESSAGE_OK);
    assert_int_equal(message_write_body(m, 1, &out), MESSAGE_OK);
    /* BODY[] is the input itself; every part lies inside it */
    memset(&sec, 0, sizeof(sec));
    buf_reset(&out);
    assert_int_equal(message_get_section(m, &sec, &out), MESSAGE_OK);
    assert_int_equal(out.len, len);
    assert_memory_equal(out.s ? out.s : "", copy, len);
    assert_true(message_header_size(m) <= len);
    assert_true(message_part_count(m) >= 1);
    for (p = 0; p < sizeof(paths) / sizeof(paths[0]); p++) {
        int r;

        buf_reset(&out);
        r = message_get_binary(m, paths[p], paths[p][2] ? 3
                               : paths[p][1] ? 2 : 1, &out, NULL);
        assert_true(r == MESSAGE_OK || r == MESSAGE_UNKNOWN_CTE);
    }
    for (p = 0; p <= sizeof(paths) / sizeof(paths[0]); p++) {
        for (k = MESSAGE_SECTION_CONTENT; k <= MESSAGE_SECTION_MIME; k++) {
            memset(&sec, 0, sizeof(sec));
            if (p > 0) {
                sec.part = paths[p - 1];
                sec.npart = paths[p - 1][2] ? 3 : paths[p - 1][1] ? 2 : 1;
            }
            sec.kind = (enum message_section_kind)k;
            sec.fields = fields;
            sec.nfields = 2;
            buf_reset(&out);
            if (p == 0 && k == MESSAGE_SECTION_MIME)
                continue;
            assert_int_equal(message_write_section(m, &sec, 3, 50, &out),
                             MESSAGE_OK);
            assert_true(out.len >= 5);
        }
    }
    buf_free(&out);
    message_free(&m);
    free(copy);
}

static void test_fuzz(void **state)
{
    static const char *const seeds[] = {
        simple_msg, alt_msg, mixed_msg, nested_msg
    };
    unsigned rnd = 12345;
    size_t s, len, i;
    int round;
    (void)state;

    for (s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        const char *seed = seeds[s];
        size_t slen = strlen(seed);
        char *mut = malloc(slen);
        assert_non_null(mut);
        for (len = 0; len <= slen; len++)
            exercise(seed, len);
        for (round = 0; round < 400; round++) {
            static const char repl[] = "\r\n-\"\\<>(),;:@=\x80 \t/\0[]";
            memcpy(mut, seed, slen);
            for (i = 0; i < 1 + (size_t)(round % 8); i++) {
                rnd = rnd * 1103515245u + 12345u;
                mut[(rnd >> 8) % slen] = repl[(rnd >> 20) % (sizeof(repl) - 1)];
            }
            rnd = rnd * 1103515245u + 12345u;
            exercise(mut, slen - (rnd >> 16) % 8);
        }
        free(mut);
    }
    /* random sequences of the fragments that matter to the parser */
    for (round = 0; round < 1500; round++) {
        static const char *const frag[] = {
            "\r\n", "\n", "--b\r\n", "--b--\r\n", "--c\r\n", "--c--",
            "Content-Type: multipart/mixed; boundary=b\r\n",
            "Content-Type: multipart/digest; boundary=\"c\"\r\n",
            "Content-Type: message/rfc822\r\n", "Content-Type: text/x;",
            "Content-Disposition: attachment; filename=\"a\\\"b\"\r\n",
            "Content-Language: en, (x) fr\r\n", "From: a <b@c>, g: d@e;\r\n",
            "To: \"x\\", "Cc: <@r:", "(c(d)", " ", "\t", ":", ";", "@", "\"",
            "\x80", "Subject: s\r\n", "body", "\r", "\\"
        };
        char buf[800];
        size_t nfrag = sizeof(frag) / sizeof(frag[0]);
        static const char *const prefix[] = {
            "", "Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n",
            "Content-Type: message/rfc822\r\n\r\n"
            "Content-Type: multipart/digest; boundary=c\r\n\r\n--c\r\n"
        };
        len = strlen(prefix[round % 3]);
        memcpy(buf, prefix[round % 3], len);
        rnd = rnd * 1103515245u + 12345u;
        for (i = 0; i < (rnd >> 16) % 40; i++) {
            const char *f;
            size_t fl;
            rnd = rnd * 1103515245u + 12345u;
            f = frag[(rnd >> 12) % nfrag];
            fl = strlen(f);
            if (len + fl > sizeof(buf))
                break;
            memcpy(buf + len, f, fl);
            len += fl;
        }
        exercise(buf, len);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple),
        cmocka_unit_test(test_partial),
        cmocka_unit_test(test_nul_in_literal),
        cmocka_unit_test(test_alternative),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_8bit),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests_name("message", tests, NULL, NULL);
}

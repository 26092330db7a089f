#!/usr/bin/env python3
"""test_roundcube.py - Roundcube webmail end to end over our servers.

A private master runs imapd (127.0.0.1), timsieved (127.0.0.1) and
lmtpd (UNIX socket), one user in a sasldb, the `sendmail` key pointing
at the test's fake sendmail (it records its arguments and input).  A private Roundcube (Debian's roundcube-core 1.6:
code in /usr/share/roundcube, never /etc/roundcube) is assembled under
the test's directory as a tree of symbolic links with its own config
directory, SQLite database (from SQL/sqlite.initial.sql), temp and log
directories, the managesieve plugin with its own configuration, and is
served by PHP's built-in server on loopback.  Headless Chromium, driven
through Selenium and chromedriver:

1. logs in over our imapd and reads a message delivered over LMTP
   before the login (subject in the list, subject and body when shown);
2. creates the folder Invoices in Settings > Folders (INBOX.Invoices,
   subscribed) and a filter in Settings > Filters (Subject contains
   "invoice": move to Invoices);
3. sets an out-of-office reply in Settings > Out of Office;
4. then, outside the browser: the user's script is active (LISTSCRIPTS
   over timsieved and the defaultbc link in the sievedir) and holds
   both rules; a message with "invoice" in its subject, delivered over
   LMTP, is filed into Invoices (IMAP, and Roundcube lists it there);
   another one, from another sender, stays in INBOX and its sender
   gets the vacation reply (the fake sendmail's record).

Run twice: test_roundcube with plaintext allowed on loopback, and
test_roundcube_starttls with allowplaintext off, where Roundcube reaches
imapd and timsieved through STARTTLS (tls://), verifying the test's
certificate; both servers' login lines must then name TLS.

A screenshot is taken at each step into a directory of its own under
TEST_TMPDIR, kept when the test fails or WEBMAIL_KEEP=1 (its path is
printed), removed otherwise.  Roundcube's IMAP and ManageSieve debug
logs (imap_debug, managesieve_debug: the protocol exchanges) are in the
instance's rc/logs, kept with LMTP_KEEP=1 and copied beside the
screenshots on failure.  Every process started (master,
php, chromedriver, chromium) is stopped by its PID.

Skips when a package is missing: chromium, chromium-driver,
python3-selenium, php-cli, php-sqlite3, roundcube-core,
roundcube-plugins.  Environment: top_builddir, TEST_TMPDIR,
WEBMAIL_KEEP, LMTP_KEEP.
"""
import os
import subprocess
import sys

SYSTEM_PYTHON = "/usr/bin/python3"
try:
    import selenium  # noqa: F401
except ImportError:
    # python3-selenium lives in the system interpreter's dist-packages;
    # another python3 first on PATH (pyenv, venv) does not see it
    if (os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON)
            and os.access(SYSTEM_PYTHON, os.X_OK)
            and subprocess.run([SYSTEM_PYTHON, "-c", "import selenium"],
                               capture_output=True).returncode == 0):
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv)

import re  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sqlite3  # noqa: E402
import ssl  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS, "imapd"), os.path.join(TESTS, "sieve")]
from imaphelp import (IMAP4, IMAPD, LMTPD, MBTOOL, Conn,  # noqa: E402
                      ImapInstance, make_message, transaction)
from testlib import (MASTER, TMPDIR, TOP_BUILDDIR, Fail, Skip,  # noqa: E402
                     alive, check, children_of, chown_run_as, cmdline,
                     free_port, kill_all, run_tests, service_line,
                     tagged_processes, wait_until)

TIMSIEVED = os.path.join(TOP_BUILDDIR, "timsieved", "timsieved")
ROUNDCUBE = "/usr/share/roundcube"
PHP = shutil.which("php") or "/usr/bin/php"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
USER, PASSWORD = "wendy", "w3ndy-pw"
ADDRESS = USER + "@test.example"
SENDER = "friend@example.com"
BILLING = "billing@example.net"
WAIT = 60                          # seconds for any page or element
KEEP_SCREENS = os.environ.get("WEBMAIL_KEEP") == "1"

FAKE_SENDMAIL = r"""#!/bin/sh
# the test's sendmail: arguments and input appended to OUT
OUT=%(out)s
{
  echo "==== ARGV: $*"
  cat
  echo "==== END"
} >> "$OUT"
exit 0
"""


def need():
    """Skip unless every package the test drives is installed."""
    missing = []
    for path, pkg in ((CHROMIUM, "chromium"),
                      (CHROMEDRIVER, "chromium-driver"),
                      (PHP, "php-cli")):
        if not os.access(path, os.X_OK):
            missing.append(pkg)
    for path, pkg in ((ROUNDCUBE + "/index.php", "roundcube-core"),
                      (ROUNDCUBE + "/SQL/sqlite.initial.sql",
                       "roundcube-sqlite3"),
                      (ROUNDCUBE + "/plugins/managesieve/managesieve.php",
                       "roundcube-plugins")):
        if not os.path.exists(path):
            missing.append(pkg)
    try:
        import selenium  # noqa: F401,F811
    except ImportError:
        missing.append("python3-selenium")
    if os.access(PHP, os.X_OK):
        mods = subprocess.run([PHP, "-m"], capture_output=True,
                              text=True).stdout.split()
        if "pdo_sqlite" not in mods:
            missing.append("php-sqlite3")
    if missing:
        raise Skip("not installed: %s (scripts/deps.sh --test)"
                   % " ".join(missing))


# ---- the mail servers ------------------------------------------------------

class MailInstance(ImapInstance):
    """imapd + timsieved on 127.0.0.1, lmtpd on a UNIX socket, one user.
    tls: a certificate and allowplaintext off (clients must STARTTLS);
    otherwise plaintext is allowed."""

    def __init__(self, tls):
        ImapInstance.__init__(self, "webmail", tls=tls,
                              sasl=(USER, PASSWORD))
        self.tls = tls
        self.sievedir = self.path("sieve")
        os.mkdir(self.sievedir)
        chown_run_as(self.sievedir)
        self.mail_out = self.path("sendmail.out")
        fake = self.path("sendmail")
        with open(fake, "w") as f:
            f.write(FAKE_SENDMAIL % {"out": self.mail_out})
        os.chmod(fake, 0o755)
        open(self.mail_out, "w").close()
        chown_run_as(self.mail_out)
        os.chmod(self.mail_out, 0o666)
        self.write_imapd_conf({"sievedir": self.sievedir, "sendmail": fake,
                               "allowplaintext": "no" if tls else "yes"})
        self.create("user." + USER)
        self.tcp_port = free_port()
        self.sieve_port = free_port()
        lines = [service_line("imap", IMAPD, "127.0.0.1:%d" % self.tcp_port,
                              prefork=1, maxchild=20),
                 service_line("sieve", TIMSIEVED, "127.0.0.1:%d"
                              % self.sieve_port, prefork=1, maxchild=10),
                 service_line("lmtpunix", LMTPD, self.unix_socket,
                              prefork=0, maxchild=10)]
        with open(self.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")

    def start(self, timeout=60):
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-s",
                    self.statusfile, "-T", "10"])

        def ready():
            return (not self.running()
                    or ((self.svc_int("imap", "ready") or 0) >= 1
                        and (self.svc_int("sieve", "ready") or 0) >= 1))
        ok = wait_until(ready, timeout)
        if not self.running():
            raise Fail("master exited at start: %s" % self.log()[-600:])
        check(ok, "imap/sieve not ready %d s after start (log: %s)"
              % (timeout, self.log()[-600:]))
        return self

    def imap(self):
        c = IMAP4("127.0.0.1", self.tcp_port)
        if self.tls:
            c.starttls(unverified())
        c.login(USER, PASSWORD)
        return c

    def sent(self):
        """[(argv, message bytes)] handed to the fake sendmail."""
        with open(self.mail_out, "rb") as f:
            data = f.read()
        return [(m.group(1).decode(), m.group(2)) for m in re.finditer(
            rb"==== ARGV: ([^\n]*)\n(.*?)==== END\n", data, re.S)]

    def user_sievedir(self):
        return os.path.join(self.sievedir, USER[0], USER)


def unverified():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def count(imap, mailbox):
    typ, data = imap.select(mailbox, readonly=True)
    check(typ == "OK", "SELECT %s: %r" % (mailbox, data))
    return int(data[0])


def subjects(imap, mailbox):
    count(imap, mailbox)
    typ, data = imap.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])")
    check(typ == "OK", "FETCH %s: %r" % (mailbox, data))
    return [part[1].decode().strip() for part in data
            if isinstance(part, tuple)]


def sieve_listscripts(addr, tls):
    """LISTSCRIPTS over timsieved (AUTHENTICATE PLAIN, after STARTTLS
    with tls)."""
    from test_timsieved import MS, lit
    import base64
    with MS(addr) as c:
        c.response()                                   # capabilities
        if tls:
            c.starttls()
        token = base64.b64encode(("\0%s\0%s" % (USER, PASSWORD)).encode())
        items, st, _, text = c.cmd(b'AUTHENTICATE "PLAIN" ' + lit(token))
        check(st == "OK", "timsieved AUTHENTICATE: %s %s" % (st, text))
        items, st, _, text = c.cmd(b"LISTSCRIPTS")
        check(st == "OK", "LISTSCRIPTS: %s %s" % (st, text))
        c.cmd(b"LOGOUT")
    return items


# ---- the private Roundcube -------------------------------------------------

RC_CONFIG = """<?php
// the test's private Roundcube (tests/webmail/test_roundcube.py)
$config = [];
$config['db_dsnw'] = 'sqlite:///%(db)s?mode=0640';
$config['imap_host'] = '%(imap_host)s';
$config['imap_conn_options'] = %(conn_options)s;
$config['imap_debug'] = true;
$config['imap_cache'] = null;
$config['smtp_host'] = '127.0.0.1:%(smtp_port)d';
$config['des_key'] = '%(des_key)s';
$config['skin'] = 'elastic';
$config['plugins'] = ['managesieve'];
$config['temp_dir'] = '%(temp)s';
$config['log_dir'] = '%(logs)s';
$config['log_driver'] = 'file';
$config['enable_installer'] = false;
$config['enable_spellcheck'] = false;
$config['create_default_folders'] = false;
$config['support_url'] = '';
$config['product_name'] = 'cyrusdeliver test';
$config['login_rate_limit'] = 0;
$config['session_lifetime'] = 60;
"""

RC_SIEVE_CONFIG = """<?php
$config['managesieve_host'] = '%(sieve_host)s';
$config['managesieve_conn_options'] = %(conn_options)s;
$config['managesieve_auth_type'] = 'PLAIN';
$config['managesieve_debug'] = true;
$config['managesieve_default'] = '';
$config['managesieve_script_name'] = 'roundcube';
$config['managesieve_vacation'] = 1;
$config['managesieve_raw_editor'] = true;
"""

# STARTTLS (tls://) with the test's certificate as the trust anchor
RC_TLS_OPTIONS = """[
  'ssl' => ['verify_peer' => true, 'verify_peer_name' => true,
            'peer_name' => 'localhost', 'cafile' => '%s'],
]"""

# INSTALL_PATH is this directory; index.php of the package does the rest
RC_INDEX = """<?php
define('INSTALL_PATH', __DIR__ . '/');
chdir(__DIR__);
include INSTALL_PATH . 'index.php.pkg';
"""


class Roundcube:
    """A private Roundcube tree under directory, served by php -S."""

    def __init__(self, directory, mail):
        scheme = "tls://" if mail.tls else ""
        conn_options = RC_TLS_OPTIONS % mail.cert if mail.tls else "null"
        self.root = os.path.join(directory, "rc")
        os.mkdir(self.root)
        for name in ("program", "SQL", "skins"):
            os.symlink(os.path.join(ROUNDCUBE, name),
                       os.path.join(self.root, name))
        os.symlink(os.path.join(ROUNDCUBE, "index.php"),
                   os.path.join(self.root, "index.php.pkg"))
        with open(os.path.join(self.root, "index.php"), "w") as f:
            f.write(RC_INDEX)
        # plugins: links to the package's, managesieve a tree of links
        # with a configuration of its own instead of Debian's
        plugins = os.path.join(self.root, "plugins")
        os.mkdir(plugins)
        for name in os.listdir(os.path.join(ROUNDCUBE, "plugins")):
            src = os.path.join(ROUNDCUBE, "plugins", name)
            if name != "managesieve":
                os.symlink(src, os.path.join(plugins, name))
                continue
            ms = os.path.join(plugins, name)
            os.mkdir(ms)
            for entry in os.listdir(src):
                if entry != "config.inc.php":
                    os.symlink(os.path.join(src, entry),
                               os.path.join(ms, entry))
            with open(os.path.join(ms, "config.inc.php"), "w") as f:
                f.write(RC_SIEVE_CONFIG % {
                    "sieve_host": "%s127.0.0.1:%d" % (scheme,
                                                      mail.sieve_port),
                    "conn_options": conn_options})
        # config: the package's defaults and MIME table, our settings
        self.config = os.path.join(self.root, "config")
        os.mkdir(self.config)
        for name in ("defaults.inc.php", "mimetypes.php"):
            for d in (os.path.join(ROUNDCUBE, "config"), "/etc/roundcube"):
                if os.path.exists(os.path.join(d, name)):
                    shutil.copy(os.path.join(d, name), self.config)
                    break
        self.logs = os.path.join(self.root, "logs")
        self.temp = os.path.join(self.root, "temp")
        os.mkdir(self.logs)
        os.mkdir(self.temp)
        self.db = os.path.join(self.root, "roundcube.db")
        with open(os.path.join(ROUNDCUBE, "SQL", "sqlite.initial.sql")) as f:
            schema = f.read()
        with sqlite3.connect(self.db) as db:
            db.executescript(schema)
        with open(os.path.join(self.config, "config.inc.php"), "w") as f:
            f.write(RC_CONFIG % {
                "db": self.db, "conn_options": conn_options,
                "imap_host": "%s127.0.0.1:%d" % (scheme, mail.tcp_port),
                "smtp_port": free_port(),      # nothing listens: not used
                "des_key": secrets.token_hex(12), "temp": self.temp,
                "logs": self.logs})
        self.port = None
        self.proc = None

    def start(self):
        self.port = free_port()
        env = dict(os.environ, ROUNDCUBE_CONFIG_DIR=self.config)
        self.errlog = open(os.path.join(self.logs, "php-server.log"), "wb")
        self.proc = subprocess.Popen(
            [PHP, "-S", "127.0.0.1:%d" % self.port, "-t", self.root],
            cwd=self.root, env=env, stdin=subprocess.DEVNULL,
            stdout=self.errlog, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                return True
            try:
                with urllib.request.urlopen(self.url(), timeout=10) as r:
                    return b"rcmloginuser" in r.read()
            except OSError:
                return False
        ok = wait_until(up, WAIT, step=0.1)
        check(self.proc.poll() is None, "php -S exited: %s" % self.php_log())
        check(ok, "no Roundcube login page %d s after php -S started: %s"
              % (WAIT, self.php_log()))
        return self

    def url(self, query=""):
        return "http://127.0.0.1:%d/%s" % (self.port, query)

    def php_log(self):
        out = []
        for name in ("php-server.log", "errors.log"):
            p = os.path.join(self.logs, name)
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    lines = [ln for ln in f if not re.search(
                        r"\] \S+ (Accepted|Closing|\[[23]0\d\]:)", ln)]
                out.append("%s: %s" % (name, "".join(lines)[-1500:]))
        return " | ".join(out)

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            self.proc = None
            self.errlog.close()


# ---- the browser -----------------------------------------------------------

class Browser:
    """Headless Chromium through chromedriver; screenshots into shots."""

    TAG = "WEBMAIL_TEST_TAG"

    def __init__(self, directory, shots):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        self.shots = shots
        self.n = 0
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu",
                  "--disable-dev-shm-usage", "--window-size=1400,1000",
                  "--no-first-run", "--disable-extensions",
                  "--user-data-dir=" + os.path.join(directory, "chromium")):
            opts.add_argument(a)
        # chromedriver and every process it starts (chromium and its
        # helpers, whoever their parent is by then) carry TAG=directory
        self.tag = directory
        self.service = Service(CHROMEDRIVER, log_path=os.path.join(
            directory, "chromedriver.log"),
            env=dict(os.environ, **{self.TAG: directory}))
        self.driver = None
        self.service.start()
        self.driver_pid = self.service.process.pid
        self.pids = {self.driver_pid}
        self.driver = webdriver.Remote(self.service.service_url,
                                       options=opts)
        self.driver.set_page_load_timeout(WAIT)
        self._note_children()

    def _note_children(self):
        """Remember chromedriver's descendants (chromium and its helpers)
        so that quit() can make sure each one is gone."""
        todo = [self.driver_pid]
        while todo:
            for c in children_of(todo.pop(), False):
                if c not in self.pids:
                    self.pids.add(c)
                    todo.append(c)

    def shot(self, name):
        self.n += 1
        path = os.path.join(self.shots, "%02d-%s.png" % (self.n, name))
        try:
            self.driver.save_screenshot(path)
        except Exception as e:  # noqa: BLE001 - a screenshot is a by-product
            sys.stdout.write("# screenshot %s failed: %r\n" % (path, e))
        return path

    def get(self, url):
        self.driver.get(url)

    def wait(self, cond, what, timeout=WAIT):
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait
        try:
            return WebDriverWait(self.driver, timeout, 0.2).until(cond)
        except TimeoutException:
            self.shot("timeout")
            raise Fail("%s: not seen in %d s (page %s)"
                       % (what, timeout, self.driver.current_url))

    def element(self, css, what=None, visible=True):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        cond = (EC.visibility_of_element_located if visible
                else EC.presence_of_element_located)
        return self.wait(cond((By.CSS_SELECTOR, css)), what or css)

    def text_in(self, css, text, what=None):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        return self.wait(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, css), text), what or "%r in %s" % (text, css))

    def quit(self):
        if self.driver is not None:
            try:
                self._note_children()
            except Exception:  # noqa: BLE001
                pass
            try:
                self.driver.quit()
            except Exception as e:  # noqa: BLE001
                sys.stdout.write("# driver.quit: %r\n" % e)
            self.driver = None
        try:
            self.service.stop()
        except Exception as e:  # noqa: BLE001
            sys.stdout.write("# chromedriver stop: %r\n" % e)
        def left():
            return sorted(set([p for p in self.pids if alive(p)]
                              + tagged_processes(self.TAG, self.tag)))
        if wait_until(lambda: not left(), 15):
            return []
        rest = left()
        kill_all(rest)
        return ["browser processes left after quit: %s"
                % ", ".join("%d(%s)" % (p, cmdline(p)[:80]) for p in rest)]


# ---- the test --------------------------------------------------------------

FIRST_SUBJECT = "Welcome to webmail"
FIRST_BODY = "This body was delivered over LMTP before the login."
VACATION_SUBJECT = "Out of office"
VACATION_BODY = "I am away until Monday; your mail will wait."


def login(b, rc):
    b.get(rc.url())
    b.element("#rcmloginuser", "login form").send_keys(USER)
    b.element("#rcmloginpwd").send_keys(PASSWORD)
    b.shot("login")
    b.element("#rcmloginsubmit").click()
    b.element("#messagelist", "message list after the login")


def read_first_message(b, rc):
    from selenium.webdriver.common.by import By
    b.text_in("#messagelist", FIRST_SUBJECT, "the message in the INBOX list")
    b.shot("inbox")
    link = b.wait(lambda d: [a for a in d.find_elements(
        By.CSS_SELECTOR, "#messagelist tr a") if FIRST_SUBJECT in a.text],
        "the subject's link")[0]
    href = link.get_attribute("href")
    check("_uid=" in href, "subject link without a uid: %r" % href)
    b.get(href)
    b.text_in("#messagebody", FIRST_BODY, "the message body")
    b.text_in("h2.subject", FIRST_SUBJECT, "the message subject")
    b.shot("message")


def select(element, value):
    from selenium.webdriver.support.ui import Select
    Select(element).select_by_value(value)


def in_frame(b, frame, element_id, what):
    """Wait until the frame shows element_id; stay in the frame."""
    from selenium.webdriver.common.by import By

    def there(d):
        # forms are loaded into a frame whose src attribute stays
        d.switch_to.default_content()
        d.switch_to.frame(frame)
        return d.find_elements(By.ID, element_id)
    b.wait(there, what)


def add_folder(b, rc):
    """Settings > Folders > Create: Invoices (IMAP: INBOX.Invoices)."""
    b.get(rc.url("?_task=settings&_action=folders"))
    b.element('a.create[onclick*="create-folder"]',
              "the Create (folder) button").click()
    in_frame(b, "preferences-frame", "_name", "the folder form")
    try:
        b.element("#_name").send_keys("Invoices")
        # the parent stays "---": the personal namespace (prefix
        # "INBOX.", as Cyrus's) makes a top folder INBOX.Invoices
        b.shot("folder-form")
        b.element('button.submit[onclick*="save"]',
                  "the folder form's Save button").click()
    finally:
        b.driver.switch_to.default_content()
    b.text_in("#subscription-table", "Invoices", "the new folder in the list")
    b.shot("folder-saved")


def add_filter(b, rc):
    """Settings > Filters > Create: Subject contains "invoice" -> move to
    Invoices; saved, the filter is in the list."""
    from selenium.webdriver.common.by import By
    b.get(rc.url("?_task=settings&_action=plugin.managesieve"))
    # the plugin made the filter set (our script) on the first visit
    # (a hidden list in this skin: its text, not what is shown)
    b.wait(lambda d: "roundcube" in d.find_element(
        By.ID, "filtersetslist").get_attribute("textContent"),
        "the filter set")
    b.shot("filters")
    b.element('a.create[onclick*="plugin.managesieve-add"]',
              "the Create (filter) button").click()
    in_frame(b, "filter-box", "_name", "the filter form")
    try:
        b.element("#_name", "the filter name field").send_keys(
            "Invoices filter")
        select(b.element("#header0"), "subject")
        select(b.element("#rule_op0"), "contains")
        b.element('input[name="_rule_target[0][]"]').send_keys("invoice")
        select(b.element("#action_type0"), "fileinto")
        select(b.element("#action_mailbox0"), "INBOX.Invoices")
        b.shot("filter-form")
        b.element('button.submit[onclick*="managesieve-save"]',
                  "the filter form's Save button").click()
    finally:
        b.driver.switch_to.default_content()
    b.text_in("#filterslist", "Invoices filter", "the new filter in the list")
    b.shot("filter-saved")


def set_vacation(b, rc):
    """Settings > Out of Office: subject, body, status On; saved."""
    b.get(rc.url("?_task=settings&_action=plugin.managesieve-vacation"))
    b.element("#vacation_subject", "the vacation form").send_keys(
        VACATION_SUBJECT)
    b.element("#vacation_reason").send_keys(VACATION_BODY)
    select(b.element("#vacation_status"), "on")
    b.shot("vacation-form")
    b.element('#vacationform button.submit, button.submit'
              '[onclick*="managesieve-save"]', "the vacation Save button"
              ).click()
    # Roundcube confirms with a message in the notification area
    b.text_in("#messagestack", "saved successfully",
              "the saved confirmation")
    b.shot("vacation-saved")


def check_script(mail):
    """The active script (timsieved's LISTSCRIPTS, the defaultbc link)
    holds the filter and the vacation rule."""
    items = sieve_listscripts(("127.0.0.1", mail.sieve_port), mail.tls)
    check(b'"roundcube" ACTIVE' in items,
          "roundcube not the ACTIVE script in LISTSCRIPTS: %r" % (items,))
    link = os.path.join(mail.user_sievedir(), "defaultbc")
    check(os.path.islink(link), "no defaultbc link in %s: %r"
          % (mail.user_sievedir(), os.listdir(mail.user_sievedir())))
    with open(link) as f:
        text = f.read()
    for want in ("fileinto", "INBOX.Invoices", '"invoice"', "vacation",
                 VACATION_SUBJECT):
        check(want in text, "%r not in the active script:\n%s"
              % (want, text))


def deliver(mail, sender, subject, body="hello\r\n"):
    """One message from sender to the user over LMTP: 250."""
    msg = make_message("%s.%f@test.example" % (sender, time.time()),
                       subject=subject, body=body, sender=sender, to=ADDRESS)
    with Conn(mail.unix_socket) as c:
        c.reply()
        mr, rr, dr, per = transaction(c, sender, [ADDRESS], msg,
                                      lhlo="test.example")
        check(len(per) == 1 and per[0].code == 250,
              "LMTP delivery of %r: %r %r %r %r" % (subject, mr, rr, dr, per))
        c.cmd("QUIT")


def deliver_and_check(b, rc, mail):
    """An invoice is filed into Invoices; another message stays in INBOX
    and its sender gets the vacation reply.  (The vacation rule applies
    to every message: the invoice's sender is answered too.)"""
    deliver(mail, BILLING, "Your invoice 42")
    deliver(mail, SENDER, "Lunch tomorrow?")
    imap = mail.imap()
    try:
        typ, lsub = imap.lsub('""', "INBOX.Invoices")
        check(typ == "OK" and lsub and lsub[0] is not None
              and b"INBOX.Invoices" in lsub[0],
              "Invoices not subscribed: %r" % lsub)
        inv = subjects(imap, "INBOX.Invoices")
        inbox = subjects(imap, "INBOX")
    finally:
        imap.logout()
    check(inv == ["Subject: Your invoice 42"],
          "Invoices holds %r, not the invoice" % inv)
    check(inbox == ["Subject: " + FIRST_SUBJECT, "Subject: Lunch tomorrow?"],
          "INBOX holds %r" % inbox)
    sent = mail.sent()
    to_sender = [m for argv, m in sent if SENDER in argv.split()]
    check(len(to_sender) == 1, "one vacation reply to %s expected, the "
          "fake sendmail got %r" % (SENDER, sent))
    check(len(sent) == 2 and any(BILLING in argv.split()
                                 for argv, _ in sent),
          "the invoice's sender not answered once: %r" % sent)
    msg = to_sender[0]
    check(VACATION_SUBJECT.encode() in msg
          and VACATION_BODY.encode() in msg.replace(b"\r\n", b" "),
          "not the vacation text: %r" % msg[:800])
    check(re.search(rb"(?mi)^In-Reply-To: <friend@example\.com", msg),
          "the reply does not answer the message: %r" % msg[:800])
    # and Roundcube shows the invoice in its folder
    b.get(rc.url("?_task=mail&_mbox=INBOX.Invoices"))
    b.text_in("#messagelist", "Your invoice 42", "the invoice in Invoices")
    b.shot("invoices")


def test_roundcube():
    """Plaintext on loopback (allowplaintext: yes)."""
    run(tls=False)


def test_roundcube_starttls():
    """allowplaintext: no; Roundcube's IMAP and ManageSieve connections
    use STARTTLS and verify the test's certificate."""
    run(tls=True)


def run(tls):
    need()
    shots = tempfile.mkdtemp(prefix="webmail-screens.", dir=TMPDIR)
    passed = False
    b = rc = None
    problems = []
    mail = MailInstance(tls)
    try:
        with mail:
            mail.start()
            deliver(mail, SENDER, FIRST_SUBJECT, FIRST_BODY + "\r\n")
            rc = Roundcube(mail.dir, mail).start()
            b = Browser(mail.dir, shots)
            try:
                login(b, rc)
                read_first_message(b, rc)
                add_folder(b, rc)
                add_filter(b, rc)
                set_vacation(b, rc)
                check_script(mail)
                deliver_and_check(b, rc, mail)
                logins = re.findall(r"(imap|timsieved): login user=<%s> "
                                    r".*tls=<([^>]*)>" % USER, mail.log())
                check({"imap", "timsieved"} <= {k for k, _ in logins},
                      "no imap and timsieved logins logged: %r" % logins)
                plain = [k for k, t in logins if t == "none"]
                check(not tls or not plain,
                      "logins without TLS: %r" % logins)
                passed = True
            finally:
                problems += b.quit()
                rc.stop()
                if not passed:
                    sys.stdout.write("# Roundcube logs: %s\n" % rc.php_log())
                    shutil.copytree(rc.logs, os.path.join(shots, "rc-logs"),
                                    dirs_exist_ok=True)
            check(not problems, "; ".join(problems))
    finally:
        if rc is not None:
            rc.stop()
        if passed and not KEEP_SCREENS:
            shutil.rmtree(shots, ignore_errors=True)
        else:
            sys.stdout.write("# screenshots in %s\n" % shots)


if __name__ == "__main__":
    sys.exit(run_tests([test_roundcube, test_roundcube_starttls],
                       "WEBMAIL_TESTS",
                       (MASTER, IMAPD, TIMSIEVED, LMTPD, MBTOOL)))

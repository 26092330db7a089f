"""testlib.py - what the Python integration tests (tests/master,
tests/lmtpd) share: check() with its Fail and Skip, polling, the user a
master started as root becomes, processes read from /proc, a free TCP
port, the master's status file, a base class for a real master run under
a test (its log, status, children, and the processes it leaves behind),
and the runner every test program ends with (PASS:/FAIL:/SKIP: lines,
"# " notes, a closing "N passed, N failed", exit status 0 only when
nothing failed).

A test program puts this directory on sys.path and imports what it
needs.  Python 3 standard library only.
"""
import os
import signal
import socket
import subprocess
import sys
import time

# the build tree, the place for temporary directories (never tmpfs: the
# servers fsync), and the programs both suites run
TOP_BUILDDIR = os.path.abspath(os.environ.get("top_builddir") or ".")
TMPDIR = os.environ.get("TEST_TMPDIR") or "/var/tmp"
MASTER = os.path.join(TOP_BUILDDIR, "master", "master")
MASTERSTATUS = os.path.join(TOP_BUILDDIR, "tools", "masterstatus")


class Fail(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def wait_until(pred, timeout, step=0.02):
    """Poll pred() until it returns a true value or timeout; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(step)


def read_text(path):
    """The text of path (bad bytes replaced), "" when unreadable."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---- the user a master started as root becomes ---------------------------

def _can_run(pw, path):
    """True when user pw can execute path (every directory above it
    searchable): checked in a child that becomes that user."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os._exit(0 if os.access(path, os.X_OK) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _run_as():
    """The passwd entry the master switches to when started as root, or
    None (not root, no user cyrus, or the build tree out of that user's
    reach, e.g. a checkout in a private mktemp directory: then the
    processes stay root and cyrus_user: root is written)."""
    if os.geteuid() != 0:
        return None
    try:
        import pwd
        pw = pwd.getpwnam("cyrus")
    except (ImportError, KeyError):
        return None
    if not _can_run(pw, MASTER):
        print("# the build tree is not reachable for user cyrus: the "
              "master and its workers run as root in these tests")
        return None
    return pw


RUN_AS = _run_as()


def root_stays():
    """True when the master runs as root: imapd.conf must then say
    cyrus_user: root (root, and no user cyrus to switch to)."""
    return os.geteuid() == 0 and RUN_AS is None


def drop_privileges():
    """preexec_fn: become RUN_AS (for mbtool, saslpasswd2)."""
    if RUN_AS is not None:
        os.setgroups([])
        os.setgid(RUN_AS.pw_gid)
        os.setuid(RUN_AS.pw_uid)


def chown_run_as(path):
    """Give path to RUN_AS (nothing when there is none)."""
    if RUN_AS is not None:
        os.chown(path, RUN_AS.pw_uid, RUN_AS.pw_gid)


# ---- processes -------------------------------------------------------------

def proc_read(pid, name):
    """The bytes of /proc/PID/NAME, or None when unreadable (gone)."""
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as f:
            return f.read()
    except OSError:
        return None


def proc_stat(pid):
    """(state, ppid, utime+stime ticks) of pid, or None when it is gone."""
    data = proc_read(pid, "stat")
    if data is None:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[1]), int(rest[11]) + int(rest[12])


def alive(pid):
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def children_of(ppid, include_zombies=True):
    """PIDs whose parent is ppid (read from /proc: cheap enough to sample
    every 20 ms)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st and st[1] == ppid and (include_zombies or st[0] != "Z"):
            out.append(int(name))
    return out


def pgrep_children(ppid):
    r = subprocess.run(["pgrep", "-P", str(ppid)], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, timeout=10)
    return [int(x) for x in r.stdout.split()]


def find_processes(match):
    """Live processes (this one left out) for which match(pid) is true."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        if match(int(name)) and alive(int(name)):
            out.append(int(name))
    return out


def tagged_processes(var, tag):
    """Live processes whose environment carries var=tag: everything the
    master of one test started, whoever its parent is now."""
    needle = ("%s=%s" % (var, tag)).encode()

    def match(pid):
        env = proc_read(pid, "environ")
        return env is not None and needle in env.split(b"\0")
    return find_processes(match)


def cmdline(pid):
    data = proc_read(pid, "cmdline")
    if data is None:
        return ""
    return data.replace(b"\0", b" ").decode(errors="replace")


def kill_all(pids):
    """SIGKILL each of pids (those already gone are no error)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def free_port(family=socket.AF_INET, host="127.0.0.1"):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def connect_socket(addr, timeout):
    """A stream socket connected to addr: a UNIX socket path, or (host,
    port) (IPv6 when host has a colon); closed again when connect fails."""
    if isinstance(addr, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        fam = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def run_threads(threads, timeout):
    """Start every thread, then join each (waiting at most timeout s for
    each one)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


# ---- a master under test ---------------------------------------------------

def parse_status(path):
    """The master's status file parsed: {"master": {...}, "services":
    {name: {...}}, "children": [{...}]}; {} when missing or unreadable."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    st = {"services": {}, "children": []}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        kv = {}
        for w in words[1:]:
            if "=" in w:
                k, v = w.split("=", 1)
                kv[k] = v
        if words[0] == "master":
            st["master"] = kv
        elif words[0] == "service" and len(words) > 1:
            kv["name"] = words[1]
            st["services"][words[1]] = kv
        elif words[0] == "child" and len(words) > 1:
            kv["name"] = words[1]
            st["children"].append(kv)
    return st


def service_line(name, cmd, listen, **opts):
    """One SERVICES entry of a cyrus.conf."""
    words = ['%s cmd="%s" listen="%s"' % (name, cmd, listen)]
    words += ["%s=%s" % (k, v) for k, v in opts.items()]
    return "  " + " ".join(words) + "\n"


class MasterRun:
    """A real master run by a test in its own directory.  A subclass sets
    dir, logfile, statusfile, proc = None and seen_children = set(), and
    names TAG_VAR: the environment variable spawn() gives the master (its
    value the directory) so that every process it starts can be found
    again, whoever its parent is by then."""

    TAG_VAR = None
    # children(): also the zombies among the master's children
    CHILD_ZOMBIES = True

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def spawn(self, cmd):
        """Start cmd (the master in the foreground) with its output
        appended to the log file."""
        env = dict(os.environ)
        env[self.TAG_VAR] = self.dir
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env,
                                         cwd=self.dir)
        self.pid = self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        return read_text(self.logfile)

    def status(self):
        return parse_status(self.statusfile)

    def service(self, name):
        return self.status().get("services", {}).get(name)

    def svc_int(self, name, key):
        s = self.service(name)
        try:
            return int(s[key]) if s else None
        except (KeyError, ValueError):
            return None

    def child_pids(self, name=None, state=None):
        out = []
        for c in self.status().get("children", []):
            if name is not None and c.get("name") != name:
                continue
            if state is not None and c.get("state") != state:
                continue
            try:
                out.append(int(c["pid"]))
            except (KeyError, ValueError):
                pass
        return out

    def children(self):
        if not self.running():
            return []
        pids = children_of(self.pid, self.CHILD_ZOMBIES)
        self.seen_children.update(pids)
        return pids

    def leftovers(self, timeout):
        """After the master is gone: wait up to timeout s for every child
        seen and every tagged process to go, SIGKILL the rest.  Returns a
        list of problems (empty when nothing was left)."""
        def rest():
            return sorted(set([p for p in self.seen_children if alive(p)]
                              + tagged_processes(self.TAG_VAR, self.dir)))
        if wait_until(lambda: not rest() or None, timeout) is not None:
            return []
        left = rest()
        kill_all(left)
        return ["processes left after the master stopped: %s"
                % ", ".join("%d(%s)" % (p, cmdline(p)) for p in left)]


# ---- runner ----------------------------------------------------------------

def run_tests(tests, env_var, needs):
    """Run test functions (named test_NAME) unless env_var lists names and
    NAME is not among them; print a PASS/FAIL/SKIP line for each and the
    summary; returns the exit status.  needs: programs that must exist."""
    for prog in needs:
        if not os.access(prog, os.X_OK):
            print("FAIL: setup (missing %s: run make first)" % prog)
            print("0 passed, 1 failed")
            return 1
    only = (os.environ.get(env_var) or "").split()
    passed = failed = skipped = 0
    t_all = time.monotonic()
    for t in tests:
        name = t.__name__[len("test_"):]
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            t()
        except Skip as e:
            skipped += 1
            print("SKIP: %s (%s)" % (name, e))
        except Fail as e:
            failed += 1
            print("FAIL: %s: %s" % (name, e))
        except Exception as e:  # noqa: BLE001 - report, go on
            failed += 1
            print("FAIL: %s: unexpected %r" % (name, e))
        else:
            passed += 1
            print("PASS: %s (%.1f s)" % (name, time.monotonic() - t0))
        sys.stdout.flush()
    if skipped:
        print("# %d skipped" % skipped)
    print("# total %.1f s" % (time.monotonic() - t_all))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1

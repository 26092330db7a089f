"""tierhelp.py - the fixture the frontend tier's tests share
(tests/lmtpd/test_lmtp_proxy.py, tests/imapd/test_imap_proxy.py,
tests/imapd/test_xfer.py) and bench/tier.py: a private 3-member etcd
cluster holding the user -> backend directory
(test_cyrusdb_etcd.Cluster), users placed with cyr_dbtool, backend
masters with imapd and lmtpd -a on their own 127.0.0.1 ports
(Backend), the imapd.conf keys of a frontend's directory, a scrape of
the frontend's Prometheus metrics, and the teardown that stops every
process by PID and reports what was left.

    tier = Tier("proxytest", "proxy.")      # work dir, cluster (not started)
    tier.start_cluster()                    # False: no leader in 90 s
    tier.place("alice", "alpha")
    b = tier.start(new_instance)            # started, or stopped and raised
    conf = tier.directory_conf(ttl="1")     # + the frontend's own keys
    ...
    rc = tier.finish(rc, [front, b, ...])   # stop, check, clean up

Python 3 standard library only.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request

TESTS = os.path.dirname(os.path.abspath(__file__))
for _d in (os.path.join(TESTS, "conformance"), os.path.join(TESTS, "imapd"),
           os.path.join(TESTS, "lmtpd"), TESTS):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from testlib import TMPDIR, check, free_port, service_line  # noqa: E402
from lmtphelp import LMTPD  # noqa: E402
from imaphelp import ImapInstance  # noqa: E402
from test_cyrusdb_etcd import DBTOOL, ETCD, ETCDCTL, Cluster  # noqa: E402


def have_ipv6():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            s.bind(("::1", 0))
            return True
        finally:
            s.close()
    except OSError:
        return False


IPV6 = have_ipv6()


def pw(user):
    """The tests' password of user."""
    return "pw-" + user


def usable(progs):
    """None when etcd and progs are there; else the exit status after a
    SKIP (77, no etcd) or FAIL (1, a program missing) line."""
    if not os.access(ETCD, os.X_OK) or not os.access(ETCDCTL, os.X_OK):
        print("SKIP: all (no %s or etcdctl)" % ETCD)
        return 77
    for prog in progs:
        if not os.access(prog, os.X_OK):
            print("FAIL: setup (missing %s)" % prog)
            return 1
    return None


class Backend(ImapInstance):
    """A master with imapd and lmtpd -a on 127.0.0.1 (two free ports),
    the same lmtpd on a UNIX socket, and on [::1] when there is one."""

    def write_cyrus_conf(self, prefork=1, maxchild=20):
        if not self.tcp_port:
            self.tcp_port = free_port()
            self.lmtp_port = free_port()
            self.lmtp6_port = free_port(socket.AF_INET6, "::1") if IPV6 else 0
        lines = [service_line("imap", "imapd", "127.0.0.1:%d" % self.tcp_port,
                              prefork=1, maxchild=maxchild),
                 service_line("lmtp", LMTPD + " -a",
                              "127.0.0.1:%d" % self.lmtp_port,
                              prefork=prefork, maxchild=maxchild),
                 # the same lmtpd on a UNIX socket and on [::1]
                 service_line("lmtpunix", LMTPD, self.unix_socket,
                              prefork=0, maxchild=maxchild)]
        if IPV6:
            lines.append(service_line("lmtp6", LMTPD + " -a",
                                      "[::1]:%d" % self.lmtp6_port,
                                      proto="tcp6", prefork=0,
                                      maxchild=maxchild))
        with open(self.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")
        return self

    def lmtp_addr(self):
        return "127.0.0.1:%d" % self.lmtp_port


class Tier:
    """The work directory, the etcd cluster and its directory, and the
    masters started under it (stopped by finish())."""

    def __init__(self, prefix_name, work_prefix, mode=None):
        self.prefix = "/%s-%d/" % (prefix_name, os.getpid())
        self.work = tempfile.mkdtemp(prefix=work_prefix, dir=TMPDIR)
        if mode is not None:
            os.chmod(self.work, mode)
        self.cluster = Cluster(self.work)
        self.dirconf = os.path.join(self.work, "dir.conf")

    def start_cluster(self, timeout=90):
        """Start the members and write the directory's tool
        configuration; False (after a FAIL line) when no leader was
        elected."""
        self.cluster.start()
        if not self.cluster.leader(timeout):
            print("FAIL: setup (the cluster elected no leader in %d s)"
                  % timeout)
            return False
        with open(self.dirconf, "w") as f:
            f.write("etcd_endpoints: %s\netcd_prefix: %s\netcd_timeout: 3000\n"
                    % (self.cluster.endpoints(), self.prefix))
        return True

    def dbtool(self, *args, stdin=None):
        p = subprocess.run([DBTOOL, "-C", self.dirconf] + list(args),
                           input=stdin, capture_output=True, timeout=60)
        check(p.returncode == 0, "cyr_dbtool %s: %r" % (args, p.stderr))
        return p

    def place(self, user, backend):
        self.dbtool("directory", "etcd", "set", user, backend)

    def place_all(self, placement):
        """Create the directory (cyr_dbtool -n) and write every
        user -> backend record of placement in one transaction."""
        first = next(iter(placement.items()))
        self.dbtool("-n", "directory", "etcd", "set", *first)
        self.dbtool("directory", "etcd", "set",
                    stdin="".join("%s\t%s\n" % kv
                                  for kv in placement.items()).encode())

    def directory_conf(self, ttl="1", timeout="1500", watched_ttl=None):
        """A frontend's imapd.conf keys for the directory in etcd.  The
        watched TTL is the plain one unless given ("": the key is left
        at its default)."""
        keys = {
            "directory_db": "etcd",
            "directory_db_path": "directory",
            "directory_cache_ttl": ttl,
            "etcd_endpoints": self.cluster.endpoints(),
            "etcd_prefix": self.prefix,
            "etcd_timeout": timeout,
        }
        if watched_ttl != "":
            keys["directory_cache_watched_ttl"] = watched_ttl or ttl
        return keys

    @staticmethod
    def start(inst):
        """Start inst's master; one that never got ready is stopped
        before the error goes up."""
        try:
            inst.start()
        except BaseException:
            inst.stop()
            raise
        return inst

    def finish(self, rc, instances, loglines=12, before_cluster=None):
        """Stop instances (None entries skipped), call before_cluster(),
        stop the cluster; the exit status: 1 when something was left or
        a worker crashed (FAIL: teardown line), else rc.  Logs' last
        lines are printed when rc is not 0; everything is removed when it
        is 0."""
        problems = []
        instances = [i for i in instances if i is not None]
        try:
            for inst in instances:
                problems += inst.stop()
                trouble = inst.worker_trouble(inst.log())
                if trouble:
                    problems.append("%s: %s" % (inst.name,
                                                " | ".join(trouble[:3])))
                if rc != 0:
                    print("# %s log (%s), last lines:" % (inst.name, inst.dir))
                    for line in inst.log().splitlines()[-loglines:]:
                        print("#   " + line)
            if before_cluster:
                before_cluster()
        finally:
            self.cluster.stop()
        left = [m["name"] for m in self.cluster.members
                if m["proc"] and m["proc"].poll() is None]
        if left:
            problems.append("etcd members still running: %s" % left)
        if problems:
            print("FAIL: teardown: %s" % "; ".join(problems))
            return 1
        if rc == 0:
            for inst in instances:
                inst.cleanup()
            shutil.rmtree(self.work, ignore_errors=True)
        return rc


# ---- the frontend's metrics -------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$')


def scrape(port, timeout=5):
    """{(name, ((label, value), ...)): float} of the exposition metricsd
    serves on 127.0.0.1:port, or None when it does not answer."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                    timeout=timeout) as r:
            if r.status != 200:
                return None
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"',
                                         m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def directory_lookups(port):
    """(answered by the cache, read from the database) of the frontend
    whose metricsd is on port; None when it does not answer."""
    s = scrape(port)
    if s is None:
        return None
    name = "cyrusdeliver_directory_lookups_total"
    return (int(s.get((name, (("source", "cache"),)), 0)),
            int(s.get((name, (("source", "database"),)), 0)))

"""powercut.py - what the power-loss tests' server instances share: their
directories owned by the user the servers run as, extra environment for
the master (the write-logging shim), and the power cut itself.

    class MyInstance(PowerCutMixin, Instance): ...

The mixin goes before the instance class (lmtphelp.Instance or
imaphelp.ImapInstance), whose spawn() it wraps; the instance sets
self.root, self.confdir, self.partition and self.extra_env.
"""
import os
import signal

from testlib import RUN_AS, alive, kill_all, tagged_processes, wait_until


class PowerCutMixin:
    def make_dirs(self):
        for d in (self.root, self.confdir, self.partition):
            os.makedirs(d, exist_ok=True)
            self.chown(d)

    @staticmethod
    def chown(path):
        if RUN_AS is not None:
            os.chown(path, RUN_AS.pw_uid, RUN_AS.pw_gid)

    def chown_tree(self, top):
        if RUN_AS is None:
            return
        for dirpath, dirs, files in os.walk(top):
            self.chown(dirpath)
            for f in files:
                os.lchown(os.path.join(dirpath, f), RUN_AS.pw_uid,
                          RUN_AS.pw_gid)

    def spawn(self, cmd):
        """The instance's spawn() with self.extra_env added."""
        saved = dict(os.environ)
        os.environ.update(self.extra_env)
        try:
            super().spawn(cmd)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def everything(self):
        return set([self.pid] + tagged_processes(self.TAG_VAR, self.dir))

    def power_cut(self):
        """SIGSTOP the master, then every process it started (until no
        new one shows up), then SIGKILL them all."""
        stopped = set()
        for _ in range(50):
            new = [p for p in self.everything() if p not in stopped]
            if not new:
                break
            for p in new:
                try:
                    os.kill(p, signal.SIGSTOP)
                except OSError:
                    pass
                stopped.add(p)
        kill_all(stopped)
        self.proc.wait(30)
        wait_until(lambda: not [p for p in stopped if alive(p)] or None, 30)
        self.proc = None

"""powerloss.py - the power loss simulator: from a snapshot of a directory
tree and the operation log lossyfs.so wrote while servers changed it,
build what a disk could hold after the power failed at a given point of
the log.

The disk model (what the simulator assumes; nothing more):
  - A write, truncate or fallocate of a file is durable once a later
    fsync() or fdatasync() of that file (any descriptor, any process),
    or a later syncfs()/sync() of the file system, has RETURNED 0; a
    write on a descriptor opened O_SYNC/O_DSYNC is durable at once.
  - A name operation (a file created by open, link, unlink, rename,
    mkdir, rmdir) is durable once a later fsync() of the directory that
    holds the new name (for unlink/rmdir the old one) or a syncfs()/sync()
    has returned 0.  An fsync of a file does NOT make its name durable,
    and a directory's own entry is durable only by a sync of ITS parent:
    no ordering of the ext4 journal is assumed.
  - "Later" is the log order of the sync's BEGIN record (lossyfs.c: a
    sync covers what was logged before it started).
  - Every other operation (unsynced) may or may not have reached the
    disk: the image applies the durable ones and a chosen subset of the
    unsynced ones, in log order, to the snapshot.  Data reaches the disk
    in 512-byte sectors (absolute file offsets), each sector holding the
    page cache's content of some moment: a write may be torn at a sector
    boundary, a write inside one sector is whole or absent.
  - Inodes: a name points to an inode; an inode's bytes are what its
    kept writes made them, whatever happened to the name it was written
    through (a staging file's unsynced name may be lost while the
    message's durable hard link in a mailbox keeps the inode).  An inode
    without a name in the image is gone.  A directory whose own entry is
    not in the image is gone with everything below it.

Policies (unsynced operations):
  none    every one dropped (the state right after the last syncs)
  all     every one kept, whole (the state the kernel had: a check of the
          harness itself, since nothing may be lost then in any mode)
  subset  each unsynced name, truncate or fallocate operation kept with
          probability 1/2; for the bytes, each 512-byte sector of each
          file independently holds a random prefix of the unsynced
          writes that touched it (in log order): the content the page
          cache had at some moment, written back sector by sector in any
          order, so a write may be torn at any sector boundary and a
          later write may survive where an earlier one (in another
          sector) did not, but a sector never holds a later write
          without the earlier ones to the same sector
  anysubset  (not used by the test; for exploring) each unsynced
          operation kept with probability 1/2 and each kept write torn
          with probability 1/2, sector by sector: stricter than any disk,
          since a sector may then hold a later write without an earlier
          one
  prefix  those before a random point kept (the last one kept torn with
          probability 1/2), those after it dropped

A cut at log offset C is the history of the first records that end at
or before C: lossyfs.c makes each call and its record one step for every
other process (a lock held across both), so every prefix of the log is a
state the machine was in.  Everything happens in one
file system (the root's).
"""
import os
import random
import shutil
import stat
import struct

REC = struct.Struct("<IIIIQQqqIIII")
MAGIC = 0x3153464C

OPEN, WRITE, TRUNCATE, FALLOCATE, LINK, RENAME, UNLINK, MKDIR, RMDIR, \
    SYNC_BEGIN, SYNC_END, INFO = range(1, 13)
K_FSYNC, K_FDATASYNC, K_SYNCFS, K_SYNC = 1, 2, 3, 4
SECTOR = 512
POLICIES = ("none", "all", "subset", "anysubset", "prefix")


class LogError(Exception):
    pass


class Rec:
    __slots__ = ("op", "pid", "ino", "off", "len", "flags", "p1", "p2",
                 "data", "end")


def read_log(path):
    """[Rec] in log order; each knows the byte offset where it ends.  A
    torn record at the end (a process killed while appending) is left
    out."""
    with open(path, "rb") as f:
        raw = f.read()
    out = []
    pos = 0
    while pos + REC.size <= len(raw):
        (magic, total, op, pid, dev, ino, off, ln, flags, l1, l2,
         dl) = REC.unpack_from(raw, pos)
        if magic != MAGIC or total != REC.size + l1 + l2 + dl:
            raise LogError("%s: bad record at offset %d" % (path, pos))
        if pos + total > len(raw):
            break
        r = Rec()
        r.op, r.pid, r.ino, r.off, r.len, r.flags = op, pid, ino, off, ln, \
            flags
        q = pos + REC.size
        r.p1 = raw[q:q + l1].decode("utf-8", "surrogateescape")
        q += l1
        r.p2 = raw[q:q + l2].decode("utf-8", "surrogateescape") if l2 \
            else None
        q += l2
        r.data = raw[q:q + dl]
        pos += total
        r.end = pos
        out.append(r)
    return out


def take_snapshot(root, snapdir, exclude=()):
    """Copy root to snapdir (call it with every writer stopped and after
    sync(1)) and return the manifest: {relative path: (kind, ino)} with
    kind "d" or "f", ino of the ORIGINAL (hard links share it)."""
    manifest = {"": ("d", os.lstat(root).st_ino)}
    os.makedirs(snapdir)
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        for d in dirs:
            r = os.path.join(rel, d)
            manifest[r] = ("d", os.lstat(os.path.join(root, r)).st_ino)
            os.mkdir(os.path.join(snapdir, r))
        for fn in files:
            r = os.path.join(rel, fn)
            if any(x in fn for x in exclude):
                continue
            st = os.lstat(os.path.join(root, r))
            if not stat.S_ISREG(st.st_mode):
                continue
            manifest[r] = ("f", st.st_ino)
            shutil.copyfile(os.path.join(root, r), os.path.join(snapdir, r))
    return manifest


class Op:
    """One resolved operation: kind ("name", "data"), what it does, the
    directory (lid) or file (lid) whose sync makes it durable, and its
    index in the log."""
    __slots__ = ("i", "kind", "what", "lid", "dlid", "a", "b", "data",
                 "sync")


class History:
    """The log resolved against the snapshot: every operation on a
    logical inode (lid), and the syncs that make them durable."""

    def __init__(self, root, snapdir, manifest, recs):
        self.root = root.rstrip("/")
        self.snapdir = snapdir
        self.kinds = {}          # lid -> "d" / "f"
        self.init_names = {}     # path -> lid (the snapshot)
        self.init_file = {}      # lid -> snapshot path of its bytes
        self.ops = []
        self.warnings = []
        self.nsyncs = 0
        ino_lid = {}
        nextlid = [0]

        def new(kind):
            nextlid[0] += 1
            self.kinds[nextlid[0]] = kind
            return nextlid[0]

        for path, (kind, ino) in manifest.items():
            if ino in ino_lid:
                lid = ino_lid[ino]
            else:
                lid = ino_lid[ino] = new(kind)
                if kind == "f":
                    self.init_file[lid] = os.path.join(snapdir, path)
            self.init_names[path] = lid
        ns = dict(self.init_names)      # the kernel's view, as we go
        begins = {}
        self.last_fsync = {}            # lid -> index of its last good sync
        self.last_global = -1

        def rel(p):
            if not p or not (p == self.root or p.startswith(self.root + "/")):
                return None
            return os.path.relpath(p, self.root) if p != self.root else ""

        def parent(p):
            return ns.get(os.path.dirname(p))

        def lid_of_ino(ino, what):
            lid = ino_lid.get(ino)
            if lid is None:
                self.warnings.append("%s: inode %d unknown" % (what, ino))
                lid = ino_lid[ino] = new("f")
            return lid

        for i, r in enumerate(recs):
            o = Op()
            o.i, o.data, o.sync = i, None, False
            if r.op == OPEN:
                p = rel(r.p1)
                if p is None:
                    continue
                if p in ns:
                    lid = ns[p]
                    ino_lid[r.ino] = lid
                else:
                    if not (r.flags & 1):
                        self.warnings.append("open of %s: not created, "
                                             "yet unknown" % p)
                    lid = ino_lid[r.ino] = new("f")
                    ns[p] = lid
                    o.kind, o.what, o.lid, o.dlid, o.a = "name", "create", \
                        lid, parent(p), p
                    self.ops.append(o)
                    o = Op()
                    o.i, o.data, o.sync = i, None, False
                if r.flags & 2:
                    o.kind, o.what, o.lid, o.a = "data", "truncate", lid, 0
                    self.ops.append(o)
            elif r.op in (WRITE, TRUNCATE, FALLOCATE):
                lid = lid_of_ino(r.ino, "op %d" % r.op)
                o.kind, o.lid = "data", lid
                if r.op == WRITE:
                    o.what, o.a, o.data, o.sync = "write", r.off, r.data, \
                        bool(r.flags & 1)
                elif r.op == TRUNCATE:
                    o.what, o.a = "truncate", r.off
                else:
                    o.what, o.a, o.b = "fallocate", (r.off, r.len), r.flags
                self.ops.append(o)
            elif r.op in (LINK, RENAME, MKDIR):
                src, dst = rel(r.p1), rel(r.p2) if r.p2 is not None else None
                if r.op == MKDIR:
                    lid = ino_lid[r.ino] = new("d")
                    ns[src] = lid
                    o.kind, o.what, o.lid, o.dlid, o.a = "name", "create", \
                        lid, parent(src), src
                    self.ops.append(o)
                    continue
                if r.op == RENAME and (r.flags & 2):   # RENAME_EXCHANGE
                    raise LogError("renameat2 RENAME_EXCHANGE is not "
                                   "modelled")
                if dst is None:                 # moved out of the root
                    if r.op == RENAME and src in ns:
                        o.kind, o.what, o.lid, o.dlid, o.a = "name", \
                            "unlink", ns[src], parent(src), src
                        self._unlink(ns, src)
                        self.ops.append(o)
                    continue
                lid = ns.get(src) if src is not None else None
                if lid is None:
                    lid = lid_of_ino(r.ino, "%s to %s" % (
                        "link" if r.op == LINK else "rename", dst))
                o.kind, o.lid, o.dlid, o.b = "name", lid, parent(dst), dst
                if r.op == LINK:
                    o.what, o.a = "link", None
                    ns[dst] = lid
                else:
                    o.what, o.a = "rename", src
                    if src is not None and src in ns:
                        self._move(ns, src, dst)
                    else:
                        ns[dst] = lid
                self.ops.append(o)
            elif r.op in (UNLINK, RMDIR):
                p = rel(r.p1)
                if p is None or p not in ns:
                    continue
                o.kind, o.what, o.lid, o.dlid, o.a = "name", "unlink", \
                    ns[p], parent(p), p
                self._unlink(ns, p)
                self.ops.append(o)
            elif r.op == SYNC_BEGIN:
                if r.flags in (K_FSYNC, K_FDATASYNC):
                    lid = ino_lid.get(r.ino)
                    if lid is None:
                        continue
                else:
                    lid = None
                begins[(r.pid, r.off)] = (i, lid)
            elif r.op == SYNC_END:
                b = begins.pop((r.pid, r.off), None)
                if b is None or r.len != 0:
                    continue
                self.nsyncs += 1
                bi, lid = b
                if lid is None:
                    self.last_global = max(self.last_global, bi)
                else:
                    self.last_fsync[lid] = max(self.last_fsync.get(lid, -1),
                                               bi)
        for o in self.ops:
            o.sync = o.sync or self.durable(o)

    @staticmethod
    def _unlink(ns, p):
        pre = p + "/"
        for k in [k for k in ns if k == p or k.startswith(pre)]:
            del ns[k]

    @staticmethod
    def _move(ns, src, dst):
        pre = src + "/"
        moved = {}
        for k in [k for k in ns if k == src or k.startswith(pre)]:
            moved[dst + k[len(src):]] = ns.pop(k)
        History._unlink(ns, dst)
        ns.update(moved)

    def durable(self, o):
        """Is operation o made durable by a later successful sync?"""
        if o.i < self.last_global:
            return True
        lid = o.lid if o.kind == "data" else o.dlid
        return lid is not None and o.i < self.last_fsync.get(lid, -1)

    def counts(self):
        d = sum(1 for o in self.ops if o.sync)
        return d, len(self.ops) - d


def history_at(root, snapdir, manifest, recs, cut):
    """The History of the records that end at or before byte offset cut."""
    return History(root, snapdir, manifest, [r for r in recs if r.end <= cut])


def _pieces(off, data):
    """(offset, bytes) of each 512-byte sector a write touches."""
    out = []
    pos = 0
    while pos < len(data):
        nxt = min(len(data), (off + pos) // SECTOR * SECTOR + SECTOR - off)
        out.append((off + pos, data[pos:nxt]))
        pos = nxt
    return out


def build_image(hist, policy, rng, outdir):
    """Materialize the image under outdir (which must not exist) after
    choosing the unsynced operations by policy with rng.  Returns a
    summary dict (ops kept/dropped/torn)."""
    unsynced = [o for o in hist.ops if not o.sync]
    keep, torn = set(), set()
    sectors = None          # subset: the (write, sector offset) pieces kept
    if policy == "all":
        keep = set(id(o) for o in unsynced)
    elif policy == "subset":
        for o in unsynced:
            if o.what != "write" and rng.random() < 0.5:
                keep.add(id(o))
        seq = {}
        for o in hist.ops:
            if o.what == "write":
                for off, _ in _pieces(o.a, o.data):
                    seq.setdefault((o.lid, off // SECTOR), []).append(
                        (o, off))
        sectors = set()
        for lst in seq.values():
            last = max([j for j, (o, _) in enumerate(lst) if o.sync],
                       default=-1)
            n = last + 1 + rng.randint(0, len(lst) - last - 1)
            for o, off in lst[:n]:
                sectors.add((id(o), off))
        for o in unsynced:
            if o.what == "write":
                got = sum(1 for off, _ in _pieces(o.a, o.data)
                          if (id(o), off) in sectors)
                if got:
                    keep.add(id(o))
                    if got < len(_pieces(o.a, o.data)):
                        torn.add(id(o))
    elif policy == "anysubset":
        for o in unsynced:
            if rng.random() < 0.5:
                keep.add(id(o))
                if o.what == "write" and rng.random() < 0.5:
                    torn.add(id(o))
    elif policy == "prefix":
        n = rng.randint(0, len(unsynced))
        for o in unsynced[:n]:
            keep.add(id(o))
        if n and unsynced[n - 1].what == "write" and rng.random() < 0.5:
            torn.add(id(unsynced[n - 1]))
    elif policy != "none":
        raise ValueError("unknown policy %r" % policy)

    names = dict(hist.init_names)
    data = {}

    def content(lid):
        if lid not in data:
            p = hist.init_file.get(lid)
            if p is not None:
                with open(p, "rb") as f:
                    data[lid] = bytearray(f.read())
            else:
                data[lid] = bytearray()
        return data[lid]

    ntorn = 0
    for o in hist.ops:
        if not (o.sync or id(o) in keep):
            continue
        if o.kind == "data":
            buf = content(o.lid)
            if o.what == "write":
                parts = [(o.a, o.data)]
                if sectors is not None:
                    parts = [p for p in _pieces(o.a, o.data)
                             if (id(o), p[0]) in sectors]
                elif id(o) in torn:
                    parts = [p for p in _pieces(o.a, o.data)
                             if rng.random() < 0.5]
                if id(o) in torn:
                    ntorn += 1
                for off, b in parts:
                    if len(buf) < off:
                        buf.extend(bytes(off - len(buf)))
                    buf[off:off + len(b)] = b
            elif o.what == "truncate":
                if len(buf) > o.a:
                    del buf[o.a:]
                else:
                    buf.extend(bytes(o.a - len(buf)))
            else:
                (off, ln), mode = o.a, o.b
                if mode & 0x02:                     # PUNCH_HOLE
                    end = min(len(buf), off + ln)
                    if end > off:
                        buf[off:end] = bytes(end - off)
                elif not (mode & 0x01) and len(buf) < off + ln:  # KEEP_SIZE
                    buf.extend(bytes(off + ln - len(buf)))
            continue
        if o.what == "create":
            names[o.a] = o.lid
        elif o.what == "link":
            names[o.b] = o.lid
        elif o.what == "rename":
            if o.a is not None and names.get(o.a) == o.lid:
                History._move(names, o.a, o.b)
            else:
                History._unlink(names, o.b)
                names[o.b] = o.lid
        elif o.what == "unlink":
            if names.get(o.a) == o.lid:
                History._unlink(names, o.a)

    # materialize: a name counts only when every directory above it does
    os.makedirs(outdir)
    placed = {}
    nfiles = 0
    for path in sorted(names, key=lambda p: (p.count("/"), p)):
        if path == "":
            continue
        lid = names[path]
        up = os.path.dirname(path)
        if up and (up not in names or hist.kinds.get(names[up]) != "d"
                   or not os.path.isdir(os.path.join(outdir, up))):
            continue
        dst = os.path.join(outdir, path)
        if hist.kinds.get(lid) == "d":
            os.mkdir(dst)
        elif lid in placed:
            os.link(placed[lid], dst)
        else:
            with open(dst, "wb") as f:
                f.write(content(lid))
            placed[lid] = dst
            nfiles += 1
    return {"kept": len(keep), "dropped": len(unsynced) - len(keep),
            "torn": ntorn, "files": nfiles}

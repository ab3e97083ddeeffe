"""File modes and exclusive directory locks shared by everything that writes user-visible output.

Temporary files (``tempfile.mkstemp``/``mkdtemp``) are created 0600/0700; once renamed into place
they must carry the modes any other file the user writes would get (0666/0777 minus the umask),
or a team on shared storage cannot read each other's data and run dirs.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Dict

from vdkit.errors import UserError


def on_this_machine(path) -> bool:
    """Whether ``path`` can be checked here: relative, or its top-level directory exists on this machine.

    An absolute path whose top-level directory is absent here (``/shared/models`` on a laptop) is the
    cluster's storage: checking it here would refuse every cluster recipe rendered away from the cluster.
    """
    path = Path(path).expanduser()
    if not path.is_absolute():
        return True
    parts = path.parts
    return len(parts) > 1 and Path(parts[0], parts[1]).exists()


def current_umask() -> int:
    """The process umask (read by setting and restoring it: there is no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(executable: bool = False) -> int:
    """The mode a new file gets under the umask (0644 for umask 022; 0755 when ``executable``)."""
    return (0o777 if executable else 0o666) & ~current_umask()


def dir_mode() -> int:
    """The mode a new directory gets under the umask (0755 for umask 022)."""
    return 0o777 & ~current_umask()


class DirLock:
    """An exclusive, non-blocking ``flock`` on ``<directory>/<name>``, removed on release.

    A second holder is refused at once (UserError with ``what`` and ``fix``). The lock dies with
    its process, so a killed writer leaves no stale lock; the file is unlinked on release, and an
    acquirer re-checks that the name still points at the inode it locked (so two processes can never
    both hold a lock through an unlinked and a new file).
    """

    def __init__(self, directory, name: str, what: str, fix: str):
        self.path = Path(directory) / name
        self.what, self.fix = what, fix
        self.fd = None

    def acquire(self) -> "DirLock":
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise UserError(self.what, self.fix) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)  # the holder before us removed the file: lock the new one

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ----------------------------------------------------------------------------- reading user files safely
MAX_YAML_BYTES = 16 * 1024 * 1024  # a recipe.yaml is a few KB; a DeepSpeed config a few hundred bytes
MAX_YAML_VALUES = 200_000  # values after aliases are expanded (an alias bomb expands to 10**9)


def replace_all(out_dir: Path, files: Dict[str, bytes]) -> None:
    """Write ``files`` ({name: bytes}) into the existing directory ``out_dir``, all or nothing.

    Every file goes to a temporary name first (synced, with the umask's mode); the renames happen only
    when all are complete, so a failure (a full disk, an interrupt) leaves the previous files, or none,
    and no temporary one."""
    import tempfile

    temps: Dict[str, str] = {}
    try:
        for name, data in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
            temps[name] = tmp
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, file_mode())  # mkstemp made it 0600; what the kit writes follows the umask
        for name, tmp in temps.items():
            os.replace(tmp, Path(out_dir) / name)
    except BaseException:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise


def not_a_regular_file(path) -> str:
    """What ``path`` is when it is not a regular file ("a directory", "a FIFO", ...), else ''.

    Reading a FIFO blocks until someone writes to it; a device may never end: name them, never open them.
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    for test, what in ((stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def expanded_size(obj, limit: int = MAX_YAML_VALUES) -> int:
    """How many values ``obj`` holds once shared (aliased) parts are counted every time they occur.

    Linear in the distinct objects (memoised by identity), so a YAML alias bomb is measured, not expanded.
    """
    memo: dict = {}

    def size(o) -> int:
        key = id(o)
        if key in memo:
            return memo[key]
        memo[key] = 1  # a self-reference counts once (and cannot loop)
        if isinstance(o, dict):
            n = 1 + sum(size(k) + size(v) for k, v in o.items())
        elif isinstance(o, (list, tuple)):
            n = 1 + sum(size(v) for v in o)
        else:
            n = 1
        memo[key] = n = min(n, limit + 1)
        return n

    return size(obj)


def load_yaml(path, what: str, fix: str = "restore the file (or re-render the run with `vdkit render`)"):
    """A user's YAML file as plain data, or a UserError naming ``what``: never a traceback, never a hang.

    Refuses a file that is not regular (a FIFO would block), larger than MAX_YAML_BYTES, unparsable,
    or that expands (through aliases) to more than MAX_YAML_VALUES values.
    """
    import yaml

    path = Path(path)
    kind = not_a_regular_file(path)
    if kind:
        raise UserError(f"{what} {path} is {'missing' if kind == 'missing' else kind}", fix)
    if path.stat().st_size > MAX_YAML_BYTES:
        raise UserError(f"{what} {path} is {path.stat().st_size:,} bytes, too large for a config file", fix)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: ~10x faster, the same data and errors
    try:
        data = yaml.load(path.read_text(encoding="utf-8", errors="replace"), Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{what} {path} is not valid YAML{where}: {problem}", fix) from None
    except RecursionError:
        raise UserError(f"{what} {path} is nested too deeply to be a config file", fix) from None
    if expanded_size(data) > MAX_YAML_VALUES:
        raise UserError(f"{what} {path} expands (through YAML aliases) to more than {MAX_YAML_VALUES:,} values: "
                        "an alias bomb, not a config", fix)
    return data

"""File modes and exclusive directory locks shared by everything that writes user-visible output.

Temporary files (``tempfile.mkstemp``/``mkdtemp``) are created 0600/0700; once renamed into place
they must carry the modes any other file the user writes would get (0666/0777 minus the umask),
or a team on shared storage cannot read each other's data and run dirs.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from vdkit.errors import UserError


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

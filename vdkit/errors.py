"""The one exception users can cause: printed as one line (what, why, how to fix), exit code 2."""
from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input. ``str()`` is the one line the CLI prints."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(what if not fix else f"{what} (fix: {fix})")


class KeepRunDir(UserError):
    """A UserError after which the run directory must stay: e.g. sbatch succeeded without a job id, so a
    job may be queued that writes into it (removing it would lose that job's output)."""


class EngineCannot(UserError):
    """A recipe its engine's spec does not hold (a method, model field, sharding or precision the engine cannot
    build): a sweep skips such a cell with a note, as it skips a cell that does not fit; one recipe is refused."""


def environment_error(exc: OSError):
    """A UserError for an OSError the machine (not the kit) caused, else None."""
    import errno

    fixes = {errno.ENOSPC: "free some space or write elsewhere (--out DIR)",
             errno.EDQUOT: "free some of your quota or write elsewhere (--out DIR)",
             errno.EFBIG: "free some space or write elsewhere (--out DIR); the file system refused a larger file",
             errno.EROFS: "write to a writable file system (--out DIR)",
             errno.EACCES: "write to a directory you may write to (--out DIR), or fix its permissions",
             errno.EPERM: "write to a directory you may write to (--out DIR)",
             errno.ENOENT: "write to a directory that can exist (--out DIR)",
             errno.ENOTDIR: "write to a directory, not into a file (--out DIR)",
             errno.EIO: "check the disk, or write elsewhere (--out DIR)",
             errno.ENAMETOOLONG: "use a shorter path (--out DIR, run.name)"}
    if exc.errno not in fixes:
        return None
    where = exc.filename if exc.filename is not None else "a file"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        return UserError(f"cannot write {where}: {exc.strerror}", fixes[exc.errno])
    return UserError(f"{where}: {exc.strerror}", fixes[exc.errno])

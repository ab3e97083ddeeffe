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

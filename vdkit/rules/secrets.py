"""Secrets at the door: no recipe value carries a token or credentials (:data:`EMBEDDED_SECRET`, cluster.env's
values included; its names have their own rule in :mod:`vdkit.rules.environment`), and ``run.secrets_file`` is a
private file of ``NAME=value`` lines with harmless names (:func:`check_secrets_file`).

Reading the file's values at run time is the launchers' business (:func:`vdkit.launch.local.read_secrets_file`,
the job script's reader in :mod:`vdkit.slurm.secrets`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError
from vdkit.rules.environment import ENV_NAME, denied_name

# A token inside any other value (a path segment, a run name, a site option) or credentials in a URL or
# image reference (user:password@host): every recipe value is written in clear into the run directory.
EMBEDDED_SECRET = re.compile(r"((?<![A-Za-z0-9])(hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|glpat-[A-Za-z0-9_-]{20,}"
                             r"|xox[abpr]-[A-Za-z0-9-]{10,}|(AKIA|ASIA)[A-Z0-9]{16})(?![A-Za-z0-9])"
                             r"|-----BEGIN|^([a-z][a-z0-9+.-]*://)?[^\s/@:]+:[^\s/@]+@(?!sha256:)[^\s/@]+)")


def _leaves(data, prefix: str = ""):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from _leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], data


def check_secret_values(recipe) -> None:
    """No recipe value may carry a token or credentials: recipe.yaml, plan.json, overrides.txt and the launcher's
    script hold them in clear. cluster.env too (its own rule refuses secret names and whole-token values; a token or
    user:password@ inside a value, HTTPS_PROXY=http://me:pw@proxy:3128, is this one's)."""
    for key, value in _leaves(recipe.to_dict()):
        if not isinstance(value, str):
            continue
        if EMBEDDED_SECRET.search(value):
            raise UserError(f"{key} looks like it holds a secret (a token or user:password@), and every recipe value "
                            "is written in clear into recipe.yaml, plan.json, overrides.txt and the job script",
                            "keep secrets out of the recipe: put NAME=value lines in a file only you can read and "
                            "pass run.secrets_file=PATH (a registry login: the container runtime's credentials)")


def check_secrets_file(path: Optional[str], required: bool) -> None:
    """``run.secrets_file``: a private (:func:`check_secrets_file_mode`), readable regular file of
    ``NAME=value`` lines with harmless names.

    ``required``: the file must exist here (``vdkit run``, ``--check-mounts``); otherwise a path
    that does not exist here is the cluster's and is checked by the job.
    """
    if not path:
        return
    p = Path(path)
    if not p.exists():
        if required:
            raise UserError(f"run.secrets_file {path} does not exist", "create it (NAME=value lines, mode 600) or "
                            "drop run.secrets_file")
        return
    if not p.is_file():
        raise UserError(f"run.secrets_file {path} is not a regular file", "point it at a file of NAME=value lines")
    check_secrets_file_mode(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"run.secrets_file {path} cannot be read: {exc.strerror}",
                        "make it readable by you (chmod 600)") from None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        name = s[len("export "):].lstrip() if s.startswith("export ") else s
        name = name.split("=", 1)[0].strip()
        why = denied_name(name) if "=" in s else "is not a NAME=value line"
        if why:
            # the line number, never the line: it may hold the secret itself
            # (a line without "=" is shown by number only: a bare token also matches ENV_NAME)
            shown = name if "=" in s and (ENV_NAME.match(name) or len(name) < 40) else f"line {n}"
            raise UserError(f"run.secrets_file {path} line {n}: {shown} {why}",
                            "keep only the secrets' own NAME=value lines (e.g. HF_TOKEN=..., WANDB_API_KEY=...)")


def check_secrets_file_mode(path: str) -> None:
    """Refuse a secrets file of yours that its group or other users can read or write (mode & 0o077).

    Refused, not warned about, as ssh refuses a private key that is "too open" (it ignores the key
    and says "Permissions 0644 for '...' are too open"): the tokens in it (HF, W&B) are as good as
    a password, a warning scrolls past while the job runs with them anyway, and every other unsafe
    input is refused at the door in one line with its fix (exit 2). Also as ssh, only a file you own
    is checked: one another user owns (a team's token file kept by its owner) is theirs to protect,
    and ``chmod`` is not yours to run on it. The line names the file and its mode, never a value.
    """
    import shlex
    import stat

    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or not mode & 0o077:
        return
    who = " and ".join(w for w, bits in (("its group", 0o070), ("other users", 0o007)) if mode & bits)
    raise UserError(f"run.secrets_file {path} has mode {mode:04o}: it is open to {who}, and the tokens in it "
                    "must be yours alone",
                    f"chmod 600 {shlex.quote(str(path))}")

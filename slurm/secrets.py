"""The secrets file (run.secrets_file), read by the job at run time as data, never as code.

The file holds ``KEY=VALUE`` lines (HF_TOKEN=..., WANDB_API_KEY=...). ``source``-ing it would run
it: ``HF_TOKEN=hf_ab$cd&ef`` breaks a ``set -u`` script and a ``$(...)`` in a value would execute.
The lines below read it with ``read -r`` instead:

- blank lines and ``#`` comments are skipped; an optional leading ``export`` is accepted;
- NAME must be a shell variable name (``[A-Za-z_][A-Za-z0-9_]*``); other lines are skipped with a
  note giving the line number only;
- VALUE is everything after the first ``=``, literally (no expansion, no command substitution);
  one pair of matching surrounding quotes (``"..."`` or ``'...'``) and a trailing CR are removed;
- a NAME the job depends on (PATH, UID, LD_*, SLURM_*, ... : vdkit.rules.environment's deny-list, refused when the
  file is checked at render time) is skipped with a note, in case the file changed since;
- values are exported, never printed (the notes name line numbers and variable names only).
"""
from __future__ import annotations

import shlex
from typing import List

SECRETS_VAR = "VDKIT_SECRETS_FILE"


def _denied_pattern() -> str:
    """A bash case pattern for the variable names a secrets file must not set (vdkit.rules.environment's deny-list)."""
    from vdkit.rules.environment import DENIED_NAMES, DENIED_PREFIXES

    return "|".join(sorted(DENIED_NAMES) + [f"{p}*" for p in DENIED_PREFIXES])


def secrets_lines(path: str) -> List[str]:
    """Bash lines that export the ``KEY=VALUE`` lines of ``path`` (see the module docstring)."""
    return [
        "# Secrets (HF_TOKEN, WANDB_API_KEY, ...) are read at run time as data (KEY=VALUE lines, never",
        "# executed); their values are never written here or printed",
        f"{SECRETS_VAR}={shlex.quote(str(path))}",
        f'if [ ! -r "${SECRETS_VAR}" ]; then',
        f'  echo "vdkit: cannot read run.secrets_file ${SECRETS_VAR}" >&2',
        "  exit 1",
        "fi",
        "vdkit_n=0",
        "while IFS= read -r vdkit_line || [ -n \"$vdkit_line\" ]; do",
        "  vdkit_n=$((vdkit_n + 1))",
        "  vdkit_line=${vdkit_line%$'\\r'}",
        "  vdkit_line=${vdkit_line#\"${vdkit_line%%[![:space:]]*}\"}",
        "  case \"$vdkit_line\" in ''|'#'*) continue ;; esac",
        "  if [[ \"$vdkit_line\" =~ ^(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then",
        "    vdkit_key=${BASH_REMATCH[2]}",
        "    vdkit_value=${BASH_REMATCH[3]}",
        # the names that would break the job (vdkit.rules.environment.DENIED_*): refused at render, skipped here too
        f"    case \"$vdkit_key\" in {_denied_pattern()})",
        f'      echo "vdkit: skipped line $vdkit_n of run.secrets_file ${SECRETS_VAR}: $vdkit_key would break the job" >&2',
        "      continue ;;",
        "    esac",
        "    if [[ ${#vdkit_value} -ge 2 && ( ( \"${vdkit_value:0:1}\" == '\"' && \"${vdkit_value: -1}\" == '\"' ) "
        "|| ( \"${vdkit_value:0:1}\" == \"'\" && \"${vdkit_value: -1}\" == \"'\" ) ) ]]; then",
        "      vdkit_value=${vdkit_value:1:${#vdkit_value}-2}",
        "    fi",
        "    export \"$vdkit_key=$vdkit_value\"",
        "  else",
        f'    echo "vdkit: skipped line $vdkit_n of run.secrets_file ${SECRETS_VAR}: not KEY=VALUE" >&2',
        "  fi",
        f'done < "${SECRETS_VAR}"',
        "unset vdkit_n vdkit_line vdkit_key vdkit_value",
    ]

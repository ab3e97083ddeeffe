"""The kit's one door to submitit: its modules, imported without submitit's import-time logging set-up.

submitit 1.5.4 configures logging when it is first imported (``submitit/core/logger.py:42``,
``logging.config.dictConfig``), and a non-incremental ``dictConfig`` first closes *every* handler the process
has made (``logging/config.py`` ``_clearExistingHandlers`` -> ``logging.shutdown``), not only its own. Some
handlers close their stream then: absl's (``absl/logging/__init__.py`` ``PythonHandler.close``; absl comes with
tensorboard, which importing Megatron-Bridge reaches) closes the stream it was made with whenever that is no
longer ``sys.stderr``. So a process that imported Bridge while another ``sys.stderr`` was in place lost that
stream at its first render: under pytest (the in-process Bridge check, then a render in a test with capsys)
pytest's own capture file was closed and pytest crashed at exit ("I/O operation on closed file").

submitit's own switch ``SUBMITIT_LOG_LEVEL=NOCONFIG`` skips that set-up; it is set for the import unless the
user chose a level. submitit's records then go where every other library's do (the root logger: warnings and
errors to stderr; its INFO lines, which went to stdout, are not shown).

The other libraries the kit imports that set logging up were checked (issue 35's last stop) and need no door:
Ray Train 2.60's ``LoggingManager`` (ray/train/v2/_internal/logging/logging.py:276-292) calls ``dictConfig`` only in
Ray's controller and worker actor processes, never in the driver (vdkit.k8s.raytrain's ``main``), and the kit's
worker loop runs the rank as a child process, whose logging is its own; Megatron-Bridge 0.3.1's
``utils/import_utils.py:31`` adds a ``StreamHandler`` on the ``sys.stderr`` of its import, which closes no stream
and logs only when a guarded import fails (none does in the kit's import path: 0 records).
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

LOG_LEVEL_VAR = "SUBMITIT_LOG_LEVEL"  # submitit/core/logger.py:14 (LOG_VARNAME)
NO_CONFIG = "NOCONFIG"  # its value for "configure nothing" (logger.py:41)


def submitit(module: str) -> ModuleType:
    """``submitit.<module>`` (e.g. ``"slurm.slurm"``), submitit imported first without its logging set-up."""
    if "submitit" not in sys.modules:
        chosen = os.environ.get(LOG_LEVEL_VAR)
        os.environ.setdefault(LOG_LEVEL_VAR, NO_CONFIG)
        try:
            import submitit  # noqa: F401  (logger.py reads the variable at import, once)
        finally:
            if chosen is None:
                os.environ.pop(LOG_LEVEL_VAR, None)
    return importlib.import_module(f"submitit.{module}")

"""Making a run directory: its name (from the run name, then ``-2``, ``-3``, ... past a taken one), the output
directory's checks, and the write itself - every file into a temporary directory, renamed into place whole or not at
all, never over an earlier run directory. What a run directory holds, and every file's name:
:mod:`vdkit.run.rundir` (this module imports it; never the reverse)."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

from vdkit.errors import UserError
from vdkit.run.rundir import OVERRIDES_FILE, PLAN_FILE, RECIPE_FILE, plan_record


def safe_dir_name(name: str) -> str:
    """A directory name from a run name: anything outside [A-Za-z0-9._-] becomes '_'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    return cleaned[:120]


def _base_path(recipe, out_dir) -> Path:
    check_out_dir(out_dir if out_dir is not None else recipe.run.out_dir)
    return Path(out_dir if out_dir is not None else recipe.run.out_dir).expanduser().absolute()


def _base_dir(recipe, out_dir) -> Path:
    base = _base_path(recipe, out_dir)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {base}: {exc.strerror}",
                        "pass --out DIR (or run.out_dir=DIR) pointing at a writable directory") from None
    return base


def check_out_dir(path) -> None:
    """Refuse an empty ``--out`` (it would write into the current directory) and a path under a file."""
    if str(path).strip() == "":
        raise UserError("--out was given an empty path (the run directories would land in the current directory)",
                        "pass --out DIR, or leave it out for run.out_dir (default ./runs)")


def missing_parents(path: Path) -> list:
    """``path`` and its parents that do not exist yet, deepest first (what a mkdir -p would create)."""
    out = []
    for p in [Path(path), *Path(path).parents]:
        if p.exists():
            break
        out.append(p)
    return out


def remove_empty(dirs) -> None:
    """Remove the directories of ``dirs`` (deepest first) that are still empty: a failed write leaves no trace."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


def _dir_engine(path: Path) -> Optional[str]:
    """The engine a run directory was rendered for (its recipe.yaml), None when it is not one or unreadable."""
    import yaml

    recipe = path / RECIPE_FILE
    try:  # a regular file of a recipe's size only: a FIFO would block the read for ever, a huge file stall it
        if not recipe.is_file() or recipe.stat().st_size > 1 << 20:
            return None
        return str(yaml.safe_load(recipe.read_text())["engine"]["name"])
    except Exception:  # not a run dir, unreadable, a hand-edited recipe: an occupant like any other
        return None


def run_dir_names(stem: str, engine: str, occupant) -> Iterator[str]:
    """Run-directory names to try in order for ``stem`` rendered by ``engine``.

    ``stem`` first; when ``occupant(stem)`` says another engine's run dir holds it (two engines rendering one
    recipe), ``stem-ENGINE``, ``stem-ENGINE-2``, ...; else (a re-render by the same engine, or a dir that is
    no run dir) ``stem-2``, ``stem-3``, ... as before. Existing names never change, so a resume or a lookup
    by an earlier name still finds its dir.
    """
    yield stem
    other = occupant(stem)
    head = f"{stem}-{safe_dir_name(engine)}" if isinstance(other, str) and other != engine else stem
    if head != stem:
        yield head
    for n in range(2, 100000):
        yield f"{head}-{n}"


def reserve_run_dir(recipe, out_dir: Optional[Union[str, Path]] = None, taken=()) -> Path:
    """The path the next run directory of ``recipe`` will get (nothing is created).

    Renderers need the final path inside the files they write; pass it back as
    ``create_run_dir(..., run_dir=path)``. ``taken``: paths already promised to other cells of
    the same command (a sweep whose cells share a run name gets ``name``, ``name-2``, ...), or a
    mapping of those paths to their cells' engines (cells of two engines: ``name``, ``name-ENGINE``).
    """
    base = _base_path(recipe, out_dir)  # created only when a run directory is written
    engines = dict(taken) if isinstance(taken, dict) else {Path(t): recipe.engine.name for t in taken}
    engines = {Path(k): v for k, v in engines.items()}

    def occupant(name):
        path = base / name
        return engines.get(path) or (path.exists() and (_dir_engine(path) or True))

    for name in run_dir_names(safe_dir_name(recipe.run_name), recipe.engine.name, occupant):
        if not (base / name).exists() and base / name not in engines:
            return base / name
    raise UserError(f"no free run-directory name next to {base / safe_dir_name(recipe.run_name)}",
                    "render into another --out directory, or set run.name")


def create_run_dir(plan, files: Dict[str, Union[str, bytes]], out_dir: Optional[Union[str, Path]] = None,
                   run_dir: Optional[Union[str, Path]] = None) -> Path:
    """Write a new run directory for ``plan`` holding recipe.yaml, plan.json, overrides.txt and ``files``.

    Everything is written into a hidden temporary directory first and renamed into place, so a
    failure leaves nothing half-written. Without ``run_dir`` the name is the run name, with ``-ENGINE``
    added when another engine's run dir has it and ``-2``, ``-3``, ... when a directory of the name exists
    (:func:`run_dir_names`; an earlier run is never overwritten).
    With ``run_dir`` (from :func:`reserve_run_dir`) exactly that path is used, and it is an error
    if it has appeared in the meantime.
    """
    import yaml

    recipe = plan.recipe
    if run_dir is not None:
        run_dir = Path(run_dir).absolute()
        out_dir = run_dir.parent
    created = missing_parents(_base_path(recipe, out_dir))
    base = _base_dir(recipe, out_dir)
    stem = safe_dir_name(recipe.run_name)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=base))
    except BaseException:
        remove_empty(created)
        raise
    try:
        contents = {
            RECIPE_FILE: yaml.safe_dump(recipe.to_dict(), sort_keys=False),
            PLAN_FILE: json.dumps(plan_record(plan), indent=2) + "\n",
            OVERRIDES_FILE: "".join(f"{o}\n" for o in recipe.overrides),
            **files,
        }
        for name, data in contents.items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, bytes):
                target.write_bytes(data)
            else:
                target.write_text(data)
        from vdkit.composition.files import dir_mode, file_mode

        for name, data in contents.items():  # a launcher's script (e.g. launch.sbatch) can be run as is
            if isinstance(data, str) and data.startswith("#!"):
                os.chmod(tmp / name, file_mode(executable=True))
        os.chmod(tmp, dir_mode())  # mkdtemp made it 0700; a run dir follows the umask like any dir
        candidates = [run_dir] if run_dir is not None else (base / name for name in run_dir_names(
            stem, recipe.engine.name, lambda name: (base / name).exists() and (_dir_engine(base / name) or True)))
        for final in candidates:
            if final.exists():
                continue
            try:
                os.rename(tmp, final)  # atomic on one file system
                return final
            except OSError:
                if not final.exists():
                    raise
        raise RunDirTaken(f"run directory {run_dir} appeared while rendering",
                          "render again: a new run directory name will be chosen")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        raise


class RunDirTaken(UserError):
    """The reserved run directory was created by someone else (a concurrent render) in the meantime."""

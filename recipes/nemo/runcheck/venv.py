"""The NeMo 1.23 virtual environment `vdkit check` runs NeMo's own code in (NeMo's pins clash with the kit's).

nemo_toolkit 1.23.0 (the ``nemo:24.01.01`` container's NeMo) pins pytorch-lightning <= 2.0.7,
hydra-core <= 1.3.2, megatron-core 0.5.0 and needs a huggingface_hub that still has ``HfFolder`` /
``ModelFilter`` (transformers 4.x, datasets 2.x), where the kit runs Lightning 2.6, hydra 1.3.8,
megatron-core 0.16, transformers 5. So it gets its own venv: :data:`PINS` installed there with
``--no-deps`` from the package index, everything else (torch, numpy, omegaconf's deps, ...) read from
the kit's own environment through a path file (the venv's own packages come first on sys.path).
Only what the check imports is installed: NeMo's megatron-core 0.5 / Apex model code is never imported
(:mod:`.shim`). What the probe imports and the kit does not declare is pinned here, never borrowed from
the kit's environment by chance (``tests/test_nemo_venv.py`` holds the probe's imports to that).

The one home of the venv's location and of its pins. :func:`location`: ``$VDKIT_NEMO_VENV``, else
``~/.cache/vdkit/nemo-1.23.0-py3.X-KEY``, KEY from this checkout's kit version, source directory, Python
and environment (:func:`key`): the path file reads *this* environment, so another checkout never shares
it. `vdkit check` makes it on first use (:func:`ensure`, about a minute, a progress line on stderr);
``python -m vdkit.recipes.nemo.runcheck.venv`` makes it ahead (CI's test fixture does, once per run).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

NEMO_VERSION = "1.23.0"
# --no-deps: each is what an import of NeMo's optimizer registry, dataset classes and tokenizer wrapper
# needed here (found by importing them); the versions are the last that NeMo 1.23's code accepts.
# requests (+ its own four) is huggingface_hub 0.22's and NeMo's: the kit's huggingface_hub 1.x uses httpx, so
# the kit's environment holds requests only by chance.
PINS = (f"nemo_toolkit=={NEMO_VERSION}", "pytorch-lightning==2.0.7", "hydra-core==1.3.2", "omegaconf==2.3.0",
        "huggingface_hub==0.22.2", "transformers==4.40.2", "tokenizers==0.19.1", "datasets==2.19.2",
        "fsspec==2024.3.1", "pyarrow_hotfix==0.7", "wget==3.2", "onnx==1.23.2", "ml_dtypes==0.6.0", "pybind11==2.13.6",
        "requests==2.34.2", "urllib3==2.8.0", "idna==3.20", "certifi==2026.7.22", "charset-normalizer==3.5.2")
READY = "vdkit-nemo-ready"  # written last: a half-made venv is never used
ABOUT = "about a minute"  # the first-use cost the README and the progress line name (measured: docs/checking-jobs.md)


def key() -> str:
    """Twelve hex digits naming this checkout's kit (version, source directory), Python and environment."""
    import vdkit

    parts = [vdkit.__version__, str(Path(vdkit.__file__).resolve().parent), sys.version, sys.prefix, *PINS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def location() -> Path:
    """Where the venv lives."""
    env = os.environ.get("VDKIT_NEMO_VENV")
    if env:
        return Path(env)
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return Path.home() / ".cache" / "vdkit" / f"nemo-{NEMO_VERSION}-{py}-{key()}"


def _stamp() -> str:
    """What READY holds: the pins and the environment the path file reads (a venv made for another is remade)."""
    return "\n".join([*PINS, f"env {sys.prefix}", f"python {sys.version.split()[0]}"])


def python(path: Path | None = None) -> Path | None:
    """The venv's interpreter, or None when it is not (completely) made for this environment."""
    path = path or location()
    ready = path / READY
    try:
        if ready.read_text().strip() != _stamp().strip():
            return None
    except OSError:
        return None
    return path / "bin" / "python"


def create(path: Path | None = None) -> Path:
    """Make the venv (python -m venv, the path file to this environment, pip install --no-deps PINS)."""
    path = path or location()
    if python(path):
        return python(path)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, capture_output=True)
    site = next((path / "lib").glob("python*/site-packages"))
    # every site directory of this environment (a path file's own path files are not read: list them all)
    dirs = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_vdkit_env.pth").write_text("".join(f"{d}\n" for d in dict.fromkeys(dirs)))
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", *PINS], check=True, capture_output=True, text=True)
    (path / READY).write_text(_stamp())
    return path / "bin" / "python"


class CannotCheck(Exception):
    """The venv could not be made here: the check cannot run NeMo's code (one line, its own exit code)."""


def ensure(progress=None) -> Path:
    """The venv's interpreter, made first where it is not (``progress``: called with one line before the minute
    it takes); CannotCheck, one line, where making it fails (no package index, no room, no venv module)."""
    py = python()
    if py is not None:
        return py
    where = location()
    if progress is not None:
        progress(f"making NeMo {NEMO_VERSION}'s own venv for the check at {where} (first use, {ABOUT}; "
                 f"{len(PINS)} packages from the package index)")
    try:
        return create(where)
    except subprocess.CalledProcessError as exc:
        tail = ((exc.stderr or "") if isinstance(exc.stderr, str) else (exc.stderr or b"").decode(errors="replace"))
        last = (tail.strip().splitlines() or [f"exit {exc.returncode}"])[-1][:200]
        raise CannotCheck(f"could not make NeMo {NEMO_VERSION}'s venv at {where}: {last}") from None
    except (OSError, StopIteration) as exc:
        raise CannotCheck(f"could not make NeMo {NEMO_VERSION}'s venv at {where}: {exc}") from None


if __name__ == "__main__":
    print(ensure(progress=lambda line: print(line, file=sys.stderr, flush=True)))

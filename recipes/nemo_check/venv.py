"""The NeMo 1.23 virtual environment `vdkit check` runs NeMo's own code in (NeMo's pins clash with the kit's).

nemo_toolkit 1.23.0 (the ``nemo:24.01.01`` container's NeMo) pins pytorch-lightning <= 2.0.7,
hydra-core <= 1.3.2, megatron-core 0.5.0 and needs a huggingface_hub that still has ``HfFolder`` /
``ModelFilter`` (transformers 4.x, datasets 2.x), where the kit runs Lightning 2.6, hydra 1.3.8,
megatron-core 0.16, transformers 5. So it gets its own venv: :data:`PINS` installed there with
``--no-deps`` from the package index, everything else (torch, numpy, omegaconf's deps, ...) read from
the kit's own environment through a path file (the venv's own packages come first on sys.path).
Only what the check imports is installed: NeMo's megatron-core 0.5 / Apex model code is never imported
(:mod:`.shim`).

The one home of the venv's location (:func:`location`: ``$VDKIT_NEMO_VENV``, else
``~/.cache/vdkit/nemo-1.23.0-py3.X``) and of its pins. ``python -m vdkit.recipes.nemo_check.venv``
creates it (CI's test fixture does, once per run).
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

NEMO_VERSION = "1.23.0"
# --no-deps: each is what an import of NeMo's optimizer registry, dataset classes and tokenizer wrapper
# needed here (found by importing them); the versions are the last that NeMo 1.23's code accepts.
PINS = (f"nemo_toolkit=={NEMO_VERSION}", "pytorch-lightning==2.0.7", "hydra-core==1.3.2", "omegaconf==2.3.0",
        "huggingface_hub==0.22.2", "transformers==4.40.2", "tokenizers==0.19.1", "datasets==2.19.2",
        "fsspec==2024.3.1", "pyarrow_hotfix==0.7", "wget==3.2", "onnx==1.23.2", "ml_dtypes==0.6.0", "pybind11==2.13.6")
READY = "vdkit-nemo-ready"  # written last: a half-made venv is never used


def location() -> Path:
    """Where the venv lives."""
    env = os.environ.get("VDKIT_NEMO_VENV")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "vdkit" / f"nemo-{NEMO_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"


def python(path: Path | None = None) -> Path | None:
    """The venv's interpreter, or None when it is not (completely) made."""
    path = path or location()
    ready = path / READY
    if not ready.is_file() or ready.read_text().strip() != "\n".join(PINS).strip():
        return None
    return path / "bin" / "python"


def create(path: Path | None = None) -> Path:
    """Make the venv (python -m venv, the path file to this environment, pip install --no-deps PINS)."""
    path = path or location()
    if python(path):
        return python(path)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    site = next((path / "lib").glob("python*/site-packages"))
    # every site directory of this environment (a path file's own path files are not read: list them all)
    dirs = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_vdkit_env.pth").write_text("".join(f"{d}\n" for d in dict.fromkeys(dirs)))
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", *PINS], check=True)
    (path / READY).write_text("\n".join(PINS))
    return path / "bin" / "python"


if __name__ == "__main__":
    print(create())

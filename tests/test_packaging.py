"""The installed wheel carries conf/ and the published figures, and finds them without a checkout."""
import subprocess
import sys
import zipfile

import pytest

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_finds_conf_and_published_data_without_the_checkout(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1:]}")
    (wheel,) = (tmp_path / "dist").glob("vdkit-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import vdkit, vdkit.composition.config as c, vdkit.render.sweep as sw, vdkit.validation.tables as t; "
            "print(vdkit.__file__); print(c.conf_dir()); "
            "print(c.compose(['model=llama2_70b', 'method=lora']).model.num_layers); "
            "print(len(sw.sweep_cells('table9'))); print(bool(t.load_published('table9'))); "
            "import vdkit.planner.predict as p; print(sorted(p.fitted()) == sorted(p.FITTED_KEYS))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith(str(site)) and lines[1] == str(site / "vdkit" / "conf")
    assert lines[2:] == ["80", "24", "True", "True"]  # the step-time calibration too


HEAVY = ("torch", "transformers", "megatron", "lightning", "peft", "deepspeed", "matplotlib")
BLOCK_HEAVY = f"""
import sys, importlib.abc
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {HEAVY!r}:
            raise ImportError('blocked for the test: ' + name)
sys.meta_path.insert(0, Refuse())
from vdkit.cli import main
rc = 0
for argv in ARGVS:
    rc |= main(argv)
loaded = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})
print('LOADED', loaded)
sys.exit(rc)
"""


def test_plan_and_render_import_no_torch(tmp_path):
    """A login node's `pip install -e .` (no extras) plans and renders every engine: torch and the
    engines' libraries are refused at import, and none was loaded."""
    argvs = [["plan", "model=llama2_7b", "method=lora"], ["plan", "--sweep", "table9"]]
    for engine in ("nemo", "bridge", "megatron", "reference"):
        # the reference engine's DDP holds fp32 weights, gradients and Adam on every GPU: a 7B SFT needs FSDP on 80 GB
        shard = ["parallelism.sharding=fsdp"] if engine == "reference" else []
        argvs.append(["render", f"engine={engine}", "model=llama2_7b", "method=sft", *shard, "--no-check-mounts",
                      "--out", str(tmp_path / engine)])
    done = subprocess.run([sys.executable, "-c", f"ARGVS = {argvs!r}\n" + BLOCK_HEAVY], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout
    assert len(list(tmp_path.glob("*/llama2_7b_sft_1n8g/launch.sbatch"))) == 4

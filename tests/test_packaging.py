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
    code = ("import vdkit, vdkit.config as c, vdkit.validation.tables as t; "
            "print(vdkit.__file__); print(c.conf_dir()); "
            "print(c.compose(['model=llama2_70b', 'method=lora']).model.num_layers); "
            "print(len(c.sweep_cells('table9'))); print(bool(t.load_published('table9'))); "
            "import vdkit.planner.predict as p; print(sorted(p.fitted()) == sorted(p.FITTED_KEYS))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith(str(site)) and lines[1] == str(site / "vdkit" / "conf")
    assert lines[2:] == ["80", "24", "True", "True"]  # the step-time calibration too

"""The README's commands are the ones that run: its tour and its cluster path, executed as written."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def bash_block(heading: str) -> list:
    """The command lines of the first ```bash block after the heading (comments stripped)."""
    text = README.read_text()
    start = text.index(heading)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    lines = []
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def sh(line: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; {line}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def vdkit_env() -> dict:
    env = dict(os.environ)
    # the console script of this interpreter's install
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def test_fresh_machine_commands_are_the_ci_ones():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    nodeps = "python3 -m pip install --no-deps megatron-bridge==0.3.1 nvidia-resiliency-ext==0.4.1 triton==3.9.0"
    test_cmd = f'python3 -m pip install torch==2.13.0 -e ".[reference,megatron,bridge,test]" && {nodeps} && python3 -m pytest -q'
    assert test_cmd in text
    assert 'python3 -m pip install -q torch==2.13.0 -e ".[reference,megatron,bridge,test]"' in ci and "python3 -m pytest -q" in ci
    assert nodeps.replace("install ", "install -q ", 1) in ci
    assert 'python3 -m pip install torch==2.13.0 -e ".[reference,megatron]" && vdkit demo' in text  # tests/test_demo.py


@pytest.mark.slow
def test_the_tour_runs_as_written(tmp_path):
    env = vdkit_env()
    for line in bash_block("## A short tour"):
        done = sh(line, tmp_path, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert (tmp_path / "runs" / "llama2_70b_lora_1n8g" / "launch.sbatch").is_file()
    assert (tmp_path / "report" / "table9.md").is_file()


DOLLY_ROWS = [{"instruction": f"What is {i} plus {i}?", "context": "" if i % 2 else f"Numbers: {i}.",
               "response": f"{2 * i}.", "category": "open_qa"} for i in range(60)]


def nemo_log(steps: int, step_s: float) -> str:
    """A NeMo 1.x Slurm .out: TQDM updates separated by carriage returns, a log record glued to one."""
    updates = []
    for s in range(steps):
        updates.append(f"Epoch 0: : {100 * (s + 1) // steps}%|##| {s + 1}/{steps} [00:{s:02d}<00:10, "
                       f"reduced_train_loss=2.{s:03d}, global_step={s}.00, consumed_samples={128 * (s + 1)}.0, "
                       f"train_step_timing in s={step_s + 0.01 * (s % 3):.3f}]")
    return "\r".join(updates) + "[NeMo I 2024-01-01 00:00:00 nemo_logging:349] done\n"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "shared"
    (site / "models").mkdir(parents=True)
    (site / "models" / "llama2-7b.nemo").write_bytes(b"stand-in")
    (site / "nemo.sqsh").write_bytes(b"stand-in")
    (tmp_path / "databricks-dolly-15k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DOLLY_ROWS))
    return site


def cluster_lines(site: Path) -> list:
    lines = bash_block("## On a real XE9680 cluster")
    assert lines[0] == "SITE=/shared"
    return [f"SITE={site}"] + lines[1:]


@pytest.mark.slow
def test_the_cluster_path_runs_as_written(tmp_path):
    site, env = _site(tmp_path), vdkit_env()
    prefix = cluster_lines(site)[0]
    run_dir = site / "runs" / "llama2_7b_lora_1n4g"
    for line in cluster_lines(site)[1:]:
        if line.startswith("enroot "):
            continue  # needs a site with enroot and the registry
        if line.startswith("sbatch "):
            # the job's output, as NeMo writes it (the sbatch itself: test below, on the local Slurm)
            (run_dir / "slurm-1.out").write_text(nemo_log(50, 2.5))
            continue
        done = sh(f"{prefix}; {line}", tmp_path, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if line.startswith("vdkit validate"):
            assert "1000" in done.stdout
    assert (site / "data" / "dolly" / "training.jsonl").is_file()
    table = json.loads((tmp_path / "report" / "table9.json").read_text())
    cell = next(c for c in table["cells"] if c["runs"])
    assert (cell["model"], cell["gpus"], cell["method"]) == ("llama2_7b", 4, "lora")
    assert cell["published_minutes"] == 102 and cell["ratio"] is not None


@pytest.mark.slurm
def test_the_cluster_paths_sbatch_line_is_accepted_by_slurm(tmp_path, local_slurm):
    site, env = _site(tmp_path), vdkit_env()
    env.update(local_slurm.env())
    lines = cluster_lines(site)
    prefix = lines[0]
    render = next(ln for ln in lines if ln.startswith("vdkit render"))
    (site / "data" / "dolly").mkdir(parents=True)
    assert sh(f"{prefix}; {render}", tmp_path, env).returncode == 0
    sbatch = next(ln for ln in lines if ln.startswith("sbatch "))
    assert shutil.which("sbatch")
    done = sh(f"{prefix}; {sbatch.replace('sbatch ', 'sbatch --test-only ', 1)}", tmp_path, env)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr

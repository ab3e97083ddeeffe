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


def fresh_machine_commands() -> tuple:
    """The two commands of "Two commands on a fresh machine": (demo, tests), each one line."""
    text = README.read_text()
    start = text.index("## Two commands on a fresh machine")
    section = text[start:text.index("\n## ", start + 3)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the section has exactly two command blocks"
    lines = [[ln for ln in b.strip().splitlines() if ln.strip()] for b in blocks]
    assert [len(x) for x in lines] == [1, 1], "each is one command line"
    return lines[0][0], lines[1][0]


def test_fresh_machine_commands_are_the_ci_ones():
    demo, tests = fresh_machine_commands()
    # a virtual environment, not the system Python (PEP 668 systems refuse a bare pip install)
    for cmd in (demo, tests):
        assert cmd.startswith("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ")
        assert "python3 -m pip install" not in cmd
    assert demo.endswith("&& .venv/bin/vdkit demo")  # tests/test_demo.py runs the demo
    assert tests.endswith("&& .venv/bin/python -m pytest -q") and "test]" in tests
    ci = [ln.strip() for ln in (README.parent / ".ci" / "run").read_text().splitlines()]
    assert tests in ci, ".ci/run must run the README's test command as written"
    # Megatron-Bridge (engine=bridge) and two of its packages without their declared (CUDA-only) dependencies
    assert "&& .venv/bin/pip install --no-deps megatron-bridge==0.3.1 nvidia-resiliency-ext==0.4.1 triton==3.9.0 &&" in tests
    assert "bridge," in tests.split("&&")[1]


def test_the_quick_loop_is_named_beside_the_full_one():
    """README names a quicker command that leaves out only declared markers, with pytest-xdist in the test extra;
    .ci/run sets VDKIT_FULL_TESTS=1 (every bad-input row) before it runs README's full line."""
    import tomllib

    from helpers import FULL_TESTS_ENV

    quick = bash_block("## Tests while you change code")
    assert len(quick) == 1 and quick[0].startswith(".venv/bin/python -m pytest -q -m "), quick
    project = tomllib.loads((README.parent / "pyproject.toml").read_text())
    declared = {m.split(":")[0] for m in project["tool"]["pytest"]["ini_options"]["markers"]}
    expr = re.search(r'-m "([^"]+)"', quick[0]).group(1)
    assert set(re.findall(r"\b(?!not\b|and\b|or\b)\w+", expr)) <= declared, expr
    if " -n " in quick[0]:
        assert any(d.startswith("pytest-xdist") for d in project["project"]["optional-dependencies"]["test"])
    ci = [ln.strip() for ln in (README.parent / ".ci" / "run").read_text().splitlines()]
    _, tests = fresh_machine_commands()
    assert f"export {FULL_TESTS_ENV}=1" in ci[:ci.index(tests)], ".ci/run runs every bad-input row"


def test_the_readme_names_where_the_data_comes_from():
    text = README.read_text()
    for dataset, source in (("dolly", "databricks/databricks-dolly-15k"), ("alpaca", "tatsu-lab/stanford_alpaca"),
                            ("pubmedqa", "pubmedqa/pubmedqa")):
        assert source in text, dataset
        assert f"vdkit data prepare {dataset}" in text or f"data prepare {dataset}" in text, dataset


def test_the_readme_layout_claim_is_what_the_planner_says():
    """README: GBS 128 has no layout on 3 or 6 nodes; on 5 nodes 13B and 70B plan TP 8 x PP 5, 7B none."""
    from vdkit.composition.config import compose
    from vdkit.errors import UserError
    from vdkit.planner.plan import make_plan

    text = " ".join(README.read_text().split())
    assert "on 3 or 6 nodes no Llama 2 size has a layout" in text and "TP 8 × PP 5" in text

    def layout(model, nodes):
        try:
            p = make_plan(compose([f"model={model}", "method=lora", f"cluster.nodes={nodes}"]))
        except UserError as exc:
            assert "no valid layout" in str(exc)
            return None
        return (p.tp, p.pp, p.dp)

    for model in ("llama2_7b", "llama2_13b", "llama2_70b"):
        assert layout(model, 3) is None and layout(model, 6) is None
    assert layout("llama2_7b", 5) is None
    assert layout("llama2_13b", 5) == layout("llama2_70b", 5) == (8, 5, 1)


TRAINS = ("vdkit run ", "vdkit validate ", "vdkit report ")  # tour lines that train here (or read what trained)


@pytest.mark.slow
def test_the_tour_runs_as_written(tmp_path):
    """The tour's lines that train (and read what trained) with the installed `vdkit` script, in a shell, as a
    user types them; its first line too (the script itself). The other lines, as written, run in one process
    in the test below (each as a process cost ~3 s of imports: ~45 s of CI for nothing more)."""
    env = vdkit_env()
    tour = bash_block("## A short tour")
    lines = [tour[0], *(ln for ln in tour if ln.startswith(TRAINS))]
    assert len(lines) >= 6, lines
    for line in lines:
        done = sh(line, tmp_path, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert (tmp_path / "report" / "table9.md").is_file()


def test_the_tour_plans_and_renders_as_written_cheaply(tmp_path, monkeypatch, capsys, shared=True):
    """Every tour line that does not train, as written, in one process (the full tour: the slow test above),
    as on a login node where /shared exists: --no-check-mounts checks no path, plan checks none."""
    import shlex

    from vdkit.composition import config, files
    from vdkit.cli import main

    if shared:  # /shared's top-level directory "exists here" (nothing under it does)
        real = files.on_this_machine
        monkeypatch.setattr(files, "on_this_machine",
                            lambda p: str(p).startswith("/shared/") or real(p))
    monkeypatch.chdir(tmp_path)
    lines = [ln for ln in bash_block("## A short tour") if not ln.startswith(TRAINS)]
    assert any("--no-check-mounts" in ln for ln in lines) and any("alpaca_opt" in ln for ln in lines)
    try:
        for line in lines:
            argv = shlex.split(line)
            assert argv[0] == "vdkit", line
            rc = main(argv[1:])
            out = capsys.readouterr()
            assert rc == 0, f"{line}\n{out.err[-2000:]}"
    finally:
        config._USER_DIRS.clear()
    assert (tmp_path / "runs" / "llama2_70b_lora_1n8g" / "launch.sbatch").is_file()
    assert (tmp_path / "site" / "cluster" / "mysite.yaml").is_file()
    if shared:  # the check still fires where it should: render without the flag refuses the missing model
        rc = main(["render", "--sweep", "llama31_roce", "--out", "runs2"])
        assert rc == 2 and "/shared/models" in capsys.readouterr().err


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
    run_dir = None
    for line in cluster_lines(site)[1:]:
        if line.startswith("enroot "):
            continue  # needs a site with enroot and the registry
        if line.startswith("sbatch "):
            # the job's output, as NeMo writes it (the sbatch itself: test below, on the local Slurm)
            (run_dir / "slurm-1.out").write_text(nemo_log(50, 2.5))
            continue
        state = f"; RUN={run_dir}" if run_dir else ""
        done = sh(f"{prefix}{state}; {line}" + ('; echo "$RUN"' if line.startswith("RUN=") else ""), tmp_path, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if line.startswith("RUN="):  # the render prints the run dir (stdout) and the exact sbatch line (stderr)
            run_dir = Path(done.stdout.strip().splitlines()[-1])
            assert run_dir == site / "runs" / "llama2_7b_lora_1n4g"
            assert f"next: sbatch {run_dir}/launch.sbatch" in done.stderr
        if line.startswith("vdkit validate"):
            assert "1000" in done.stdout
    assert (site / "data" / "dolly" / "training.jsonl").is_file()
    table = json.loads((tmp_path / "report" / "table9.json").read_text())
    cell = next(c for c in table["cells"] if c["runs"])
    assert (cell["model"], cell["gpus"], cell["method"]) == ("llama2_7b", 4, "lora")
    assert cell["published_minutes"] == 102 and cell["ratio"] is not None


@pytest.mark.slurm
def test_the_cluster_paths_sbatch_line_is_accepted_by_slurm(tmp_path, local_slurm):
    site = _site(tmp_path)
    env = local_slurm.env(vdkit_env())  # keep vdkit_env's PATH (this interpreter's console scripts)
    lines = cluster_lines(site)
    prefix = lines[0]
    render = next(ln for ln in lines if ln.startswith("RUN=$(vdkit render"))
    (site / "data" / "dolly").mkdir(parents=True)
    sbatch = next(ln for ln in lines if ln.startswith("sbatch "))
    assert shutil.which("sbatch")
    done = sh(f"{prefix}; {render}; {sbatch.replace('sbatch ', 'sbatch --test-only ', 1)}", tmp_path, env)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr

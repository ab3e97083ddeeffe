"""Issue 21 class 8, smaller losses: nothing a user made is lost or refused for no reason.

- concurrent renders into one out dir take the next free name instead of failing;
- ZeRO-3 keeps the newest checkpoints only, like every other strategy (never the one ``latest`` names).
(A resumed run appending to local-1.out / rankN.out is the local launcher's, tests of issue 17.)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.render.prepare import prepare

REF = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1"]


def test_a_render_whose_name_was_taken_meanwhile_takes_the_next_free_one(tmp_path):
    cell = prepare(make_plan(compose(REF)), tmp_path)
    reserved = cell.run_dir
    reserved.mkdir()  # another render wins the race for the same name after we reserved it
    (reserved / "launch.sbatch").write_text("theirs\n")
    written = cell.write()
    assert written != reserved and written.parent == tmp_path and written.name.endswith("-2")
    assert (reserved / "launch.sbatch").read_text() == "theirs\n"  # theirs untouched
    ours = (written / "launch.sbatch").read_text()
    assert str(written) in ours and f"{reserved}/" not in ours  # the script names its own run dir


def test_concurrent_renders_into_one_out_dir_all_succeed(tmp_path):
    """Four processes, three renders each, one run name: twelve run dirs, no error."""
    code = ("import sys; from vdkit.cli import main; "
            "sys.exit(max(main(['render', *sys.argv[2:], '--out', sys.argv[1]]) for _ in range(3)))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), *REF], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), [err[-500:] for _, err, rc in results if rc]
    dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    printed = sorted(line for out, _, _ in results for line in out.splitlines() if line.startswith("/"))
    assert len(dirs) == 12 and sorted(map(str, dirs)) == printed
    assert all((d / "launch.sbatch").is_file() and str(d) in (d / "launch.sbatch").read_text() for d in dirs)


def test_zero3_keeps_the_newest_checkpoints_and_the_latest(tmp_path):
    from vdkit.recipes.common.checkpoint import KEEP
    from vdkit.recipes.reference.sharding import prune_deepspeed_tags

    for step in (5, 10, 15, 20, 25):
        (tmp_path / f"step={step}").mkdir()
        (tmp_path / f"step={step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
    (tmp_path / "latest").write_text("step=25")
    (tmp_path / "zero_to_fp32.py").write_text("# DeepSpeed's helper: never touched\n")
    removed = prune_deepspeed_tags(tmp_path, KEEP)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [p.name for p in removed] == ["step=5", "step=10", "step=15"][: 5 - KEEP]
    assert left == sorted(["latest", "zero_to_fp32.py"] + [f"step={s}" for s in (5, 10, 15, 20, 25)[-KEEP:]])
    # a `latest` pointing at an older tag (a resumed run saving again) keeps that tag too
    (tmp_path / "step=30").mkdir()
    (tmp_path / "latest").write_text("step=20")
    prune_deepspeed_tags(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step=20", "step=30"]

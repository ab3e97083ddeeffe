"""CLI answers that must be right (issue 12 items 6-8): sweeps skip no-layout cells in every verb,
overrides anywhere on the line, plan --check for scripts."""
from __future__ import annotations

import json

import pytest

from vdkit.cli import main
from vdkit.commands.plan import EXIT_DOES_NOT_FIT


def test_plan_sweep_skips_the_cell_without_a_layout_with_a_note(capsys):
    assert main(["plan", "-m", "model=llama2_7b", "cluster.nodes=1,3,4", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["nodes"] for line in out.splitlines()] == [1, 4]
    assert err.count("vdkit plan: skipped") == 1 and "cluster.nodes=3" in err and "layout" in err


def test_plan_named_sweep_with_an_override_that_leaves_no_layout(capsys):
    assert main(["plan", "--sweep", "table9", "cluster.nodes=3", "--json"]) == 2  # every cell: nothing left
    err = capsys.readouterr().err.strip().splitlines()
    # one line (issue 21): the first cell's reason and how many more, not a note per cell and "see above"
    assert len(err) == 1 and "no cell of the sweep" in err[0] and "layout" in err[0] and "more cell" in err[0]


def test_demo_sweep_skips_like_render(tmp_path, capsys, monkeypatch):
    """Every cell skipped (no layout): one error line with the reason, before anything is written."""
    assert main(["demo", "-m", "cluster.gpus_per_node=3", "train.global_batch_size=8", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cell of the sweep" in err[0] and "layout" in err[0]
    assert not any(tmp_path.rglob("recipe.yaml"))


@pytest.mark.parametrize("argv", [
    ["plan", "model=llama2_7b", "--json", "method=sft"],
    ["plan", "--json", "model=llama2_7b", "method=sft"],
    ["plan", "model=llama2_7b", "method=sft", "--json"],
])
def test_overrides_anywhere_on_the_line(capsys, argv):
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["model"], plan["method"]) == ("llama2_7b", "sft")


def test_render_options_between_overrides(tmp_path, capsys):
    assert main(["render", "engine=reference", "--out", str(tmp_path), "model=tiny_llama", "--no-check-mounts",
                 "data=synthetic", "cluster.gpus_per_node=1"]) == 0
    assert (tmp_path / "tiny_llama_lora_1n1g" / "launch.sbatch").is_file()


def test_plan_check_exit_code_tells_scripts_it_does_not_fit(capsys):
    assert main(["plan", "model=llama2_70b", "method=sft", "cluster.nodes=1"]) == 0  # an answer
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["plan", "--check", "model=llama2_70b", "method=sft", "cluster.nodes=1"]) == EXIT_DOES_NOT_FIT == 3
    assert main(["plan", "--check", "model=llama2_7b", "method=lora"]) == 0
    assert main(["plan", "--check", "-m", "model=llama2_7b", "cluster.nodes=1,3"]) == EXIT_DOES_NOT_FIT  # skipped


def test_percent_in_the_out_dir_is_escaped_for_sbatch_patterns(tmp_path, capsys):
    """Issue 12 item 11: sbatch expands %j / %x / %u in --output; a literal '%' must reach it as '%%'."""
    out = tmp_path / "100% %j %x"
    assert main(["render", "engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
                 "--out", str(out)]) == 0
    run_dir = capsys.readouterr().out.strip()
    text = (out / "tiny_llama_lora_1n1g" / "launch.sbatch").read_text()
    escaped = run_dir.replace("%", "%%")
    assert f"#SBATCH --output={escaped}/slurm-%j.out" in text.replace("'", "")
    assert f"#SBATCH --error={escaped}/slurm-%j.err" in text.replace("'", "")


def test_plan_of_a_sweep_skips_the_cells_its_engine_cannot_run_with_a_note(capsys):
    """`vdkit plan --sweep table9 engine=bridge` stopped at the first P-tuning cell (exit 2); the README says cells
    that cannot run are skipped with a note (issue 36)."""
    from vdkit.cli import main

    assert main(["plan", "--sweep", "table9", "engine=bridge"]) == 0
    out, err = capsys.readouterr()
    notes = err.strip().splitlines()
    assert notes and all(n.startswith("vdkit plan: skipped ") and "method=ptuning" in n
                         and "engine=bridge has no such method" in n for n in notes), notes
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("llama2_")]
    assert rows and {r[1] for r in rows} == {"sft", "lora"}


def test_a_checked_sweep_prints_one_line_per_cell_and_a_total(tmp_path, capsys, monkeypatch):
    """`render --sweep table9 --check` printed 281 lines, cells unnamed, no total (issue 36)."""
    from pathlib import Path

    from vdkit.commands import check
    from vdkit.run.jobcheck import Report

    def fake_check(dirs):  # the engines' checks are test_check.py's: here only what render prints of them
        out = []
        for i, d in enumerate(dirs):
            rep = Report(Path(d), "stack 1.0", seconds=0.5)
            rep.checked("config built")
            rep.not_here("the image")
            if i:
                rep.defect("bad", "engine.x", "use y")
            out.append(rep)
        return out

    monkeypatch.setattr(check, "check_dirs", fake_check)
    assert main(["render", "-m", "engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
                 "train.seed=1,2,3", "--check", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    cells = [ln for ln in err if ln.startswith(str(tmp_path)) and "checked, " in ln]
    assert len(cells) == 3 and cells[0].endswith(": ok (1 checked, 1 not checked here, 0.5 s)")
    assert cells[1].endswith(": 1 defect(s) (1 checked, 1 not checked here, 0.5 s)")
    assert any(ln.startswith("checked 3 run dir(s): 1 ok, 2 with defects, 1.5 s") for ln in err)
    assert not any(ln.startswith("  checked ") for ln in err)  # no finding-by-finding listing

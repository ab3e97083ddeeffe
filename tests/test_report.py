"""Report and validate answers that must not mislead (issue 12 items 14 and 16)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import TINY, make_run, series
from vdkit.cli import main
from vdkit.validation.extrapolate import estimate
from vdkit.validation.tables import NOT_PUBLISHED, NOT_PUBLISHED_MARK

ROOT = Path(__file__).resolve().parents[1]


def test_no_published_figure_is_not_the_guides_na(tmp_path, capsys):
    tiny = make_run(tmp_path / "runs", TINY, series(0.2, seed=5))
    na = make_run(tmp_path / "runs", ["model=llama2_70b", "method=sft", "cluster.nodes=1"])  # guide: N/A
    out = tmp_path / "rep"
    assert main(["report", str(tiny), str(na), "--out", str(out), "--no-plots"]) == 0
    md = capsys.readouterr().out
    cells = {(c["model"], c["gpus"], c["method"]): c for c in json.loads((out / "table9.json").read_text())["cells"]}
    assert cells[("tiny_llama", 1, "lora")]["published_status"] == NOT_PUBLISHED
    assert cells[("llama2_70b", 8, "sft")]["published_status"] == "N/A"
    assert cells[("llama2_70b", 16, "lora")]["published_status"] == "figure"  # a published row, not run
    assert f"/ {NOT_PUBLISHED_MARK}" in md and "| Llama 2 70B | 8 |" in md and "N/A / N/A" in md
    assert f"- {NOT_PUBLISHED_MARK}: the guide publishes no figure" in md
    assert "published_status" in (out / "table9.csv").read_text().splitlines()[0]


def test_reproducing_doc_describes_the_demo_table_as_it_is():
    doc = (ROOT / "docs" / "reproducing.md").read_text()
    assert "has no published\ncolumn" not in doc and "no published column" not in doc.replace("\n", " ")
    assert f"`{NOT_PUBLISHED_MARK}`" in doc


def _parts(includes) -> int:
    """The iteration counts the 'includes' line names (warm-up, steady mean, measured), summed."""
    text = "; ".join(includes)
    return sum(int(n) for n in re.findall(r"(\d+) (?:warm-up iteration|iteration\(s\) at the steady mean|"
                                          r"measured iteration)", text))


def test_includes_line_adds_up_to_the_target_steps(tmp_path, capsys):
    for n, target in ((20, 1000), (50, 1000), (50, 40), (7, 7)):
        est = estimate(series(1.0, n=n, seed=n), target)
        assert _parts(est.includes) == target, (n, target, est.includes)
    run = make_run(tmp_path / "runs", TINY, series(0.2, n=20, seed=3))
    assert main(["validate", str(run)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("includes"))
    assert _parts(line.split("includes", 1)[1].strip().split("; ")) == 1000, line


def test_a_second_report_into_the_same_dir_leaves_no_stale_plots(tmp_path, capsys):
    a = make_run(tmp_path / "runs", TINY + ["method=lora"], series(0.2, seed=1))
    b = make_run(tmp_path / "runs", TINY + ["method=sft"], series(0.3, seed=2))
    out = tmp_path / "report"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert {p.name for p in out.glob("trace_*.png")} == {f"trace_{a.name}.png", f"trace_{b.name}.png"}
    (out / "notes.md").write_text("mine")  # not the kit's: stays
    assert main(["report", str(b), "--out", str(out)]) == 0  # e.g. `vdkit demo` run again: new run dirs
    assert {p.name for p in out.glob("trace_*.png")} == {f"trace_{b.name}.png"}
    assert (out / "notes.md").read_text() == "mine" and (out / "table9_scaling.png").is_file()


def test_a_cancelled_run_reads_as_cancelled_never_as_a_figure(tmp_path, capsys):
    """`vdkit cancel` after 12 of 50 steps, then `vdkit report`: the cell showed '3.52 [e]', a 1000-step figure as
    if the run had finished. It reads 'cancelled' (with when, after how many steps and how to continue); a
    finished run of the same cell still gives the figure; `vdkit validate` extrapolates and says so."""
    from vdkit.run.rundir import CANCELLED_FILE

    stopped = make_run(tmp_path / "runs", TINY + ["train.max_steps=50"], series(0.2, n=12, seed=1))
    (stopped / CANCELLED_FILE).write_text(json.dumps({"at": "2026-11-29T02:49:35Z", "launcher": "local", "jobs": [],
                                                      "continue": "vdkit run --resume x"}) + "\n")  # vdkit cancel's
    out = tmp_path / "rep"
    assert main(["report", str(stopped), "--out", str(out), "--no-plots"]) == 0
    md = capsys.readouterr().out
    assert "| tiny_llama | 1 | cancelled / n/p |" in md and "[e]" not in md.split("| tiny_llama |")[1].split("\n")[0]
    assert "after 12 of 50 steps (continue: vdkit run --resume x)" in md
    cell = next(c for c in json.loads((out / "table9.json").read_text())["cells"] if c["method"] == "lora")
    assert cell["status"] == "cancelled" and cell["minutes"] is None and cell["interval_minutes"] is None
    assert main(["validate", "--json", str(stopped)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cancelled"].startswith("cancelled by `vdkit cancel` at 2026-11-29T02:49:35Z after 12 of 50 steps")
    assert any("it is no finished run's figure" in w for w in result["warnings"])
    done = make_run(tmp_path / "runs", TINY + ["train.max_steps=50", "run.name=done"], series(0.2, n=50, seed=2))
    assert main(["report", str(stopped), str(done), "--out", str(out), "--no-plots"]) == 0
    cell = next(c for c in json.loads((out / "table9.json").read_text())["cells"] if c["method"] == "lora")
    assert cell["status"] == "extrapolated" and cell["runs"] == [str(stopped), str(done)]

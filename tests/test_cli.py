"""The CLI front door: plan output, --json keys, sweeps, error lines and exit codes, fast start-up."""
import json
import subprocess
import sys

from vdkit.cli import main


def test_plan_json_keys(capsys):
    assert main(["plan", "model=llama2_70b", "method=sft", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    for key in ("model", "method", "nodes", "gpus", "tp", "pp", "dp", "grad_accum", "feasible",
                "memory_per_gpu_gb", "checkpoint_gb", "reason"):
        assert key in obj
    assert obj["feasible"] is False and obj["reason"]


def test_plan_feasible_json_reason_is_null(capsys):
    assert main(["plan", "model=llama2_7b", "method=lora", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] is None


def test_plan_text_shows_the_memory_parts(capsys):
    assert main(["plan", "model=llama2_70b", "method=sft", "cluster.nodes=1"]) == 0
    out = capsys.readouterr().out
    for word in ("TP", "PP", "DP", "gradient accumulation", "weights", "gradients", "optimizer", "activations",
                 "DOES NOT FIT", "checkpoint"):
        assert word in out


def test_plan_sweep_table9_prints_one_row_per_cell(capsys):
    assert main(["plan", "--sweep", "table9"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("llama2_")]
    assert len(rows) == 24


def test_plan_multirun_json_one_object_per_cell(capsys):
    assert main(["plan", "-m", "model=llama2_7b,llama2_13b", "cluster.nodes=1,2", "--json"]) == 0
    objs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {(o["model"], o["nodes"]) for o in objs} == {(m, n) for m in ("llama2_7b", "llama2_13b") for n in (1, 2)}


def test_errors_are_one_line_exit_2(capsys):
    for argv in (["plan", "cluster.nodess=2"], ["plan", "+bogus=1"], ["plan", "model=nope"],
                 ["plan", "parallelism.tp=3"], ["plan", "--sweep", "nope"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("vdkit plan: error:") and "\n" not in err and "Traceback" not in err


def test_help_does_not_import_heavy_libraries():
    code = ("import sys; from vdkit.cli import build_parser; build_parser().format_help(); "
            "heavy = [m for m in ('torch', 'transformers', 'lightning', 'matplotlib', 'submitit', 'tensorboard') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "vdkit", "plan", "--json"], capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["model"] == "llama2_7b"


# ----------------------------------------------------------------------------- issue 28: pipes, list, help
def test_a_closed_stdout_is_no_traceback():
    """`vdkit plan ... | head -1`: the reader is gone before vdkit writes (a pipe whose read end is closed)."""
    import os

    r, w = os.pipe()
    os.close(r)
    try:
        done = subprocess.run([sys.executable, "-m", "vdkit", "plan", "model=llama2_7b", "method=lora"],
                              stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert done.returncode == 0 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_list_takes_singular_and_plural(capsys):
    assert main(["list", "cluster"]) == 0
    singular = capsys.readouterr().out
    assert main(["list", "clusters"]) == 0
    assert singular == capsys.readouterr().out and "xe9680" in singular


def test_every_verb_that_writes_run_dirs_names_every_engine_and_its_files():
    from vdkit.cli import build_parser
    from vdkit.recipes.engines import names, specs

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    for verb in ("render", "run", "submit", "demo"):
        text = " ".join(sub.choices[verb].format_help().split())
        for engine in names():
            assert engine in text, (verb, engine)
        if verb != "demo":
            for files in (s.run_dir_files for s in specs()):
                assert all(f in text for f in files), (verb, files)


def test_a_future_stop_at_is_said_not_refused_and_other_verbs_ignore_what_they_do_not_read():
    """`vdkit run` with the Slurm budget variable set for later: the ranks will stop then, and the line says so
    (a stale one is refused: the bad-input table's i36-env rows)."""
    import time

    from vdkit.commands.envcheck import check_environment

    later = {"VDKIT_STOP_AT": str(int(time.time()) + 600)}
    (line,) = check_environment("run", later)
    assert "VDKIT_STOP_AT" in line and "stop cleanly" in line and "unset it" in line
    assert check_environment("plan", {"VDKIT_STOP_AT": "1", "DS_ACCELERATOR": "tpu", "SLURM_CONF": "/nowhere"}) == []
    assert check_environment("run", {"DS_ACCELERATOR": "cpu"}) == []


def test_an_argument_the_verb_lacks_is_the_verbs_error_and_names_what_it_takes(capsys):
    """`vdkit runs --out DIR` said 'fix: see `vdkit --help`' (the top level's help, which lists no verb's options):
    the line is the verb's own (its prog, its help), says where it takes a directory positionally, and names the
    option nearly spelt so; every verb, sub-verbs too."""
    import argparse

    import pytest

    from vdkit.cli import build_parser

    def refusal(*argv):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(list(argv))
        assert info.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        return line

    line = refusal("runs", "--out", "/tmp/runs")
    assert line.startswith("vdkit runs: error: unrecognized arguments: --out (fix: ") and "Traceback" not in line, line
    assert "vdkit runs takes DIR positionally, as in `vdkit runs DIR`; see `vdkit runs --help`)" in line, line
    assert "did you mean --out? see `vdkit report --help`" in refusal("report", "--outt", "x")
    assert refusal("data", "stats", "x", "--bogus").startswith("vdkit data stats: error: unrecognized arguments: --bogus")
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for verb in verbs:  # whatever a verb takes, an option it lacks is its own error and its own help
        line = refusal(verb, "--no-such-option")
        assert f"vdkit {verb}" in line and f"see `vdkit {verb}" in line, line

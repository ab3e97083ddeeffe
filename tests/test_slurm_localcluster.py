"""The local emulated Slurm: six XE9680 nodes, a real two-node gloo job, job state without accounting."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vdkit.errors import UserError
from vdkit.slurm import localcluster as lc, localcluster_conf as hw
from vdkit.slurm import submit as sub


# ----------------------------------------------------------------------------- no cluster needed
def test_reason_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = lc.why_unavailable()
    assert reason and "root" in reason


def test_reason_names_missing_packages(monkeypatch):
    real = lc._which
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(lc, "_which", lambda name: None if name in ("munged", "slurmd") else real(name))
    reason = lc.why_unavailable()
    assert "munged" in reason and "slurmd" in reason and "apt-get install" in reason


def test_status_of_a_directory_without_a_cluster(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vdkit.slurm.localcluster", "status", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "down" in proc.stdout and "Traceback" not in proc.stderr


def test_up_as_non_root_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(lc.LocalSlurmUnavailable, match="needs root"):
        lc.up(tmp_path / "c")
    assert not (tmp_path / "c" / "slurm.conf").exists()


def test_state_from_the_job_output_when_slurm_is_gone(tmp_path, monkeypatch):
    """No Slurm client on PATH (record purged, no accounting): Slurm's own lines in the log decide."""
    (tmp_path / "job_id.txt").write_text("41\n4242\n")
    (tmp_path / "slurm-4242.err").write_text(
        "slurmstepd: error: *** JOB 4242 ON xe9680-1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    st = sub.job_state(tmp_path)
    assert (st.job_id, st.state, st.source) == ("4242", "TIMEOUT", "log")
    (tmp_path / "slurm-4242.err").write_text("srun: error: xe9680-2: task 1: Exited with exit code 1\n")
    assert sub.job_state(tmp_path).state == "FAILED"
    (tmp_path / "slurm-4242.err").write_text("all fine\n")
    assert sub.job_state(tmp_path).state == "UNKNOWN"


def test_status_of_a_directory_never_submitted(tmp_path):
    with pytest.raises(UserError, match="no job was submitted"):
        sub.job_state(tmp_path)


# ----------------------------------------------------------------------------- against the real Slurm
def test_six_idle_xe9680_nodes(local_slurm):
    out = local_slurm.run("sinfo", "-h", "-N", "-o", "%N|%P|%t|%c|%m|%G", check=True).stdout
    rows = sorted(line.split("|") for line in out.splitlines())
    assert [r[0] for r in rows] == lc.node_names()
    want_cpus = hw.SOCKETS * hw.CORES_PER_SOCKET * hw.THREADS_PER_CORE
    for name, part, state, cpus, mem, gres in rows:
        assert part.rstrip("*") == lc.PARTITION and state == "idle"
        assert int(cpus) == want_cpus and int(mem) == hw.REAL_MEMORY_MB
        assert gres.startswith(f"gpu:{hw.GPUS_PER_NODE}")
    assert os.environ["SLURM_CONF"] == str(local_slurm.conf)


GLOO_JOB = """\
#!/bin/bash
#SBATCH --job-name=gloo-check
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=5
#SBATCH --output={run_dir}/slurm-%j.out
set -euo pipefail
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
export MASTER_ADDR=$(scontrol -o show node "$first" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
export MASTER_PORT=29533
echo "MASTER_ADDR=$MASTER_ADDR first=$first"
srun {python} -c '
import os, torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
node, gpus = os.environ["SLURMD_NODENAME"], os.environ.get("CUDA_VISIBLE_DEVICES")
print(f"rank={{rank}} world={{dist.get_world_size()}} sum={{t.item():g}} node={{node}} gpus={{gpus}}", flush=True)
dist.destroy_process_group()
'
"""


def test_two_node_gloo_job_and_its_state(local_slurm, tmp_path, monkeypatch):
    run_dir = tmp_path / "gloo"
    run_dir.mkdir()
    (run_dir / "launch.sbatch").write_text(GLOO_JOB.format(run_dir=run_dir, python=sys.executable))
    s = sub.submit_run(run_dir)
    assert s.job_id and sub.job_ids(run_dir) == [s.job_id]
    st = sub.wait(run_dir, timeout=120, poll_s=1)
    out = (run_dir / f"slurm-{s.job_id}.out").read_text()
    assert st.state == "COMPLETED", out
    assert st.source == "scontrol" and st.exit_code == "0:0"  # accounting is off: no sacct here
    ranks = sorted(line for line in out.splitlines() if line.startswith("rank="))
    assert len(ranks) == 2, out
    nodes = {tok.split("=")[1] for line in ranks for tok in line.split() if tok.startswith("node=")}
    assert nodes == set(lc.node_names()[:2])
    assert all("world=2" in r and "sum=3" in r and "gpus=0,1,2,3,4,5,6,7" in r for r in ranks), out
    assert "MASTER_ADDR=127.0.0.1" in out
    # Slurm forgets the job (simulated: no Slurm client at all) -> the state saved when it ended.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert (sub.job_state(run_dir).state, sub.job_state(run_dir).source) == ("COMPLETED", "saved")


def test_failing_job_is_failed_with_its_exit_code(local_slurm, tmp_path):
    (tmp_path / "launch.sbatch").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --nodes=1
        #SBATCH --time=2
        #SBATCH --output={tmp_path}/slurm-%j.out
        srun bash -c 'exit 3'
        """))
    s1 = sub.submit_run(tmp_path)
    st = sub.wait(tmp_path, timeout=60, poll_s=1)
    assert (st.state, st.exit_code) == ("FAILED", "3:0")
    s2 = sub.submit_run(tmp_path)  # a resubmission appends
    assert sub.job_ids(tmp_path) == [s1.job_id, s2.job_id]
    sub.cancel(tmp_path)
    assert sub.wait(tmp_path, timeout=60, poll_s=1).state in ("CANCELLED", "FAILED")


def test_test_only_refuses_a_seventh_node(local_slurm, tmp_path):
    (tmp_path / "launch.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=7\n#SBATCH --gpus-per-node=8\ntrue\n")
    with pytest.raises(UserError, match="rejected"):
        sub.submit_run(tmp_path, test_only=True)
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "launch.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=6\n#SBATCH --gpus-per-node=8\n"
                                      "#SBATCH --ntasks-per-node=8\n#SBATCH --exclusive\n#SBATCH --mem=0\ntrue\n")
    s = sub.submit_run(ok, test_only=True)
    assert s.job_id is None and "xe9680-[1-6]" in s.message
    assert not (ok / "job_id.txt").exists()

"""A real Slurm on this machine: six emulated XE9680 nodes, for the tests and for trying the kit.

Debian's slurm-wlm (22.05) and munge, run as root, everything inside one directory of its own
(config, munge key and socket, state, spool, logs, pid files, fake GPU device files); nothing
under /etc is read or written. ``SlurmdParameters=config_overrides`` lets each node claim an
XE9680's 2 x 48 cores, 2 TB and eight GPUs although all six share this machine; each node is one
``slurmd -N xe9680-<i>`` on 127.0.0.1 with a port of its own.

Clients (sbatch, srun, squeue, scontrol, sinfo) reach it through ``SLURM_CONF=<dir>/slurm.conf``;
:meth:`LocalCluster.env` returns an environment with it set.

    python -m vdkit.slurm.localcluster up [--dir DIR]      # prints `export SLURM_CONF=...`
    python -m vdkit.slurm.localcluster status [--dir DIR]
    python -m vdkit.slurm.localcluster down [--dir DIR]

(``vdkit cluster up|status|down`` does the same.) Node names do not resolve: a job reaches its
first node through that node's NodeAddr (127.0.0.1), e.g. from ``scontrol show node``.

A container stand-in: on a real XE9680 site the ranks run in a pyxis/enroot container, where no
Slurm client command exists (NVIDIA/pyxis#129). Here the job steps get the same: a TaskProlog
replaces every directory of PATH that holds a Slurm client (sbatch, srun, scontrol, ...) by a mirror
of it without them, for every task of every job step; the batch shell, which on a real site runs on
the node outside the container, keeps them. So a rank that calls ``scontrol`` fails here as it
would under pyxis, and continuation has to happen in the batch shell.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from vdkit.errors import UserError
from vdkit.slurm.localcluster_conf import (CLIENT_BINARIES, NODE_PREFIX, NUM_NODES, PARTITION, SERVER_BINARIES,
                                          write_config)

APT_HINT = "install them with `apt-get install -y slurm-wlm munge` (Debian/Ubuntu)"


class LocalSlurmUnavailable(UserError):
    """The local Slurm cannot be started here (not root, packages missing, a daemon failing)."""


def default_dir() -> Path:
    """Where `up` puts the cluster unless told: $VDKIT_SLURM_DIR or <tmp>/vdkit-slurm."""
    return Path(os.environ.get("VDKIT_SLURM_DIR") or Path(tempfile.gettempdir()) / "vdkit-slurm").absolute()


def node_names(n: int = NUM_NODES) -> List[str]:
    return [f"{NODE_PREFIX}-{i}" for i in range(1, n + 1)]


def why_unavailable() -> Optional[str]:
    """The reason the local Slurm cannot start on this machine, or None when it should."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "the local Slurm needs Linux"
    if os.geteuid() != 0:
        return "the local Slurm needs root (slurmd starts jobs as their user); run as root, e.g. in a container"
    missing = [b for b in SERVER_BINARIES + CLIENT_BINARIES if _which(b) is None]
    if missing:
        return f"Slurm/munge programs not found: {', '.join(missing)}; {APT_HINT}"
    return None


def _which(name: str) -> Optional[str]:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def _read_pid(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_munge_key(path: Path) -> None:
    """A new random munge key at ``path``, mode 0400 from its creation (owner read-only, what munged
    requires of its key): created with that mode and O_EXCL, never written first and chmod-ed after,
    so no other user can open it in between whatever the umask; an existing file is an error."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))


@dataclass
class LocalCluster:
    """A local Slurm living in ``root``. Build with :func:`up`; stop with :meth:`down`."""

    root: Path
    nodes: int = NUM_NODES

    # ------------------------------------------------------------------ layout
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def node_names(self) -> List[str]:
        return node_names(self.nodes)

    @property
    def partition(self) -> str:
        return PARTITION

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """An environment in which Slurm's client commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        # A job started from inside another Slurm job would inherit that job's variables.
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]
        return env

    def run(self, *args: str, timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; returns the completed process."""
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=check)

    def _pid_files(self) -> List[Path]:
        run = self.root / "run"
        return [run / "slurmctld.pid"] + [run / f"slurmd-{n}.pid" for n in self.node_names]

    def _munge_pid_file(self) -> Path:
        return self.root / "munge" / "munged.pid"

    # ------------------------------------------------------------------ state
    def is_up(self) -> bool:
        """True when munged, slurmctld and every slurmd of this directory are running."""
        pids = [_read_pid(p) for p in self._pid_files() + [self._munge_pid_file()]]
        return all(p is not None and _pid_alive(p) for p in pids)

    def node_states(self) -> Dict[str, str]:
        """Node name -> Slurm state (idle, alloc, down*, ...) as sinfo reports it."""
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        if out.returncode != 0:
            return {}
        states = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def describe(self) -> str:
        """A short human summary: up or down, and sinfo's node table when up."""
        if not self.is_up():
            return f"local Slurm in {self.root}: down"
        out = self.run("sinfo", "-N", "-o", "%N %P %t %c %m %G", timeout=10)
        return f"local Slurm in {self.root}: up (export SLURM_CONF={self.conf})\n{out.stdout.rstrip()}"

    # ------------------------------------------------------------------ start
    def write_config(self) -> None:
        """Write slurm.conf, gres.conf, an empty plugstack.conf, the fake GPU devices and the container stand-in."""
        write_config(self.root, self.node_names, self.munge_socket, self.conf)

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        os.chmod(mdir, 0o755)  # clients of any user reach the socket; the key itself is 0400
        key = mdir / "munge.key"
        if not key.exists():
            write_munge_key(key)
        log = mdir / "munged.log"
        cmd = [_which("munged"), f"--socket={self.munge_socket}", f"--key-file={key}",
               f"--pid-file={self._munge_pid_file()}", f"--log-file={log}",
               f"--seed-file={mdir / 'munged.seed'}", "--force", "--num-threads=2"]
        proc = _spawn_daemon(cmd, mdir / "munged.stderr")
        if proc != 0:
            raise LocalSlurmUnavailable(
                f"munged failed to start (exit {proc}): {_tail(mdir / 'munged.stderr')} {_tail(log)}",
                f"see {log}")
        # munged answers once its socket exists; prove it round-trips a credential.
        deadline = time.time() + 15
        while time.time() < deadline:
            cred = subprocess.run([_which("munge"), "-n", "-S", str(self.munge_socket)],
                                  capture_output=True, timeout=10)
            if cred.returncode == 0:
                check = subprocess.run([_which("unmunge"), "-S", str(self.munge_socket)],
                                       input=cred.stdout, capture_output=True, timeout=10)
                if check.returncode == 0:
                    return
            time.sleep(0.2)
        raise LocalSlurmUnavailable(f"munge does not answer on {self.munge_socket}: {_tail(log)}",
                                    f"see {log}")

    def start(self, timeout: float = 90) -> "LocalCluster":
        """Start munged, slurmctld and one slurmd per node; wait until sinfo shows them all idle."""
        reason = why_unavailable()
        if reason:
            raise LocalSlurmUnavailable(reason)
        if self.is_up():
            return self
        self.down()  # half-started leftovers of an earlier attempt
        self.write_config()
        self._start_munge()
        log = self.root / "log"
        rc = _spawn_daemon([_which("slurmctld"), "-c", "-f", str(self.conf)], log / "slurmctld.stderr")
        if rc != 0:
            self.down()
            raise LocalSlurmUnavailable(
                f"slurmctld failed to start (exit {rc}): {_tail(log / 'slurmctld.stderr')} "
                f"{_tail(log / 'slurmctld.log')}", f"see {log}")
        for name in self.node_names:
            rc = _spawn_daemon([_which("slurmd"), "-f", str(self.conf), "-N", name], log / f"slurmd-{name}.stderr")
            if rc != 0:
                self.down()
                raise LocalSlurmUnavailable(
                    f"slurmd -N {name} failed to start (exit {rc}): {_tail(log / f'slurmd-{name}.stderr')} "
                    f"{_tail(log / f'slurmd-{name}.log')}", f"see {log}")
        deadline = time.time() + timeout
        states: Dict[str, str] = {}
        while time.time() < deadline:
            states = self.node_states()
            if len(states) == self.nodes and all(s == "idle" for s in states.values()):
                return self
            time.sleep(0.5)
        self.down()
        raise LocalSlurmUnavailable(
            f"the local Slurm nodes did not become idle within {timeout:.0f} s (sinfo: {states or 'no answer'}): "
            f"{_tail(log / 'slurmctld.log')}", f"see the logs in {log}")

    # ------------------------------------------------------------------ stop
    def down(self, timeout: float = 20) -> None:
        """Cancel jobs, stop every daemon this directory started (by pid file), keep the logs."""
        if self.conf.exists() and any(_alive(p) for p in self._pid_files()):
            try:
                self.run("scancel", "--full", "--partition", PARTITION, timeout=10)
                self.run("scontrol", "shutdown", timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _stop_pids(self._pid_files(), timeout)
        _stop_pids([self._munge_pid_file()], timeout)


def _alive(pid_file: Path) -> bool:
    pid = _read_pid(pid_file)
    return pid is not None and _pid_alive(pid)


def _stop_pids(pid_files: List[Path], timeout: float) -> None:
    """SIGTERM the processes named in pid_files, SIGKILL those still alive after timeout."""
    pids = [p for p in (_read_pid(f) for f in pid_files) if p is not None and _pid_alive(p)]
    deadline = time.time() + timeout
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    while pids and time.time() < deadline:
        pids = [p for p in pids if _pid_alive(p)]
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for f in pid_files:
        try:
            f.unlink()
        except OSError:
            pass


def _spawn_daemon(cmd: List[str], stderr_file: Path) -> int:
    """Run a self-daemonizing program; its output goes to a file (a pipe would stay open for its life)."""
    with open(stderr_file, "ab") as err:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=60,
                              start_new_session=True).returncode


def up(root: Optional[os.PathLike] = None, nodes: int = NUM_NODES, timeout: float = 90) -> LocalCluster:
    """Start (or find running) the local Slurm in ``root`` (default :func:`default_dir`)."""
    cluster = LocalCluster(Path(root).absolute() if root else default_dir(), nodes)
    cluster.root.mkdir(parents=True, exist_ok=True)
    return cluster.start(timeout=timeout)


def down(root: Optional[os.PathLike] = None) -> None:
    """Stop the local Slurm in ``root`` (default :func:`default_dir`); its logs stay."""
    LocalCluster(Path(root).absolute() if root else default_dir()).down()


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m vdkit.slurm.localcluster up|down|status [--dir DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m vdkit.slurm.localcluster",
                                     description="An emulated six-node XE9680 Slurm on this machine (root).")
    add_cluster_args(parser)
    args = parser.parse_args(argv)
    try:
        return run_cluster_command(args)
    except UserError as exc:
        print(f"local Slurm: error: {exc}", file=sys.stderr)
        return exc.exit_code


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """The arguments of `cluster up|down|status` (shared with `vdkit cluster`)."""
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory holding the cluster (default $VDKIT_SLURM_DIR or /tmp/vdkit-slurm)")


def run_cluster_command(args: argparse.Namespace) -> int:
    """Do `up`, `down` or `status`; prints what a user needs (the SLURM_CONF line after `up`)."""
    root = args.dir.absolute() if args.dir else default_dir()
    if args.action == "up":
        cluster = up(root)
        print(f"local Slurm up: {cluster.nodes} nodes in partition {PARTITION}; point clients at it with:")
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    cluster = LocalCluster(root)
    if args.action == "down":
        cluster.down()
        print(f"local Slurm in {root}: stopped (logs kept in {root / 'log'})")
        return 0
    print(cluster.describe())
    return 0 if cluster.is_up() else 1


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoints you can trust, for Megatron-Bridge: before a resume, a damaged or incomplete latest ``iter_N`` is set
aside (renamed, never deleted) and Bridge's tracker pointed at the newest complete one (:func:`trust_latest`).

Like ``bridge_job.py`` (:mod:`.job`, which calls it), this file is copied into each run directory (``bridge_trust.py``,
beside it) and runs in NVIDIA's image as it is: the standard library and torch only, nothing from vdkit but the run dir's pre-flight
(``vdkit_preflight.py``, which bridge_job.py imports too: its :func:`dcp_short_file` checks the shards).
"""
import os
import time

TRACKER = "latest_checkpointed_iteration.txt"  # Bridge's / Megatron's "latest complete checkpoint" file


def checkpointed_iteration(save_dir):
    """The iteration of the latest complete checkpoint in ``save_dir`` (0: none)."""
    try:
        with open(os.path.join(str(save_dir), TRACKER)) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return 0


# What a (synchronous, torch_dist) save of Megatron-Bridge 0.3.1 writes, in order - megatron/bridge/training/
# checkpointing.py save_checkpoint: every rank its shards into iter_N (megatron-core dist_checkpointing/
# serialization.py save: common.pt, the shards, torch's .metadata written as .metadata.tmp and renamed - torch/
# distributed/checkpoint/filesystem.py FileSystemWriter.finish -, then metadata.json); a barrier; then rank 0's
# train_state_finalize_fn: iter_N/train_state.pt, its copy latest_train_state.pt (shutil.copy), the tracker
# latest_checkpointed_iteration.txt (open "w": a kill mid-write leaves it empty), and run_config.yaml LAST. Only
# torch's .metadata is atomic; Bridge's load reads latest_train_state.pt (the tracker only without it) and needs
# run_config.yaml ("Legacy checkpoint missing 'args'"). So iter_N is complete when every file below is there and
# no shard is shorter than torch's .metadata says (bytes flipped inside a shard are not detected: neither torch's
# format nor Bridge keeps a checksum). Set aside = renamed (never deleted): the bytes may matter to someone.
COMPLETE_FILES = (".metadata", "common.pt", "metadata.json", "train_state.pt", "run_config.yaml")
LATEST_STATE = "latest_train_state.pt"  # Bridge's copy of the latest iter_N/train_state.pt (read first on load)
DAMAGED_MARK = ".damaged-"  # as vdkit.recipes.common.trust's (tests check they agree): `vdkit status` lists them
# Bridge's most_recent_k clean-up globs iter_* under the save dir and int()s the rest of each name
# (checkpointing.py cleanup_old_non_persistent_checkpoint): a set-aside name must not start with "iter_".
ASIDE_PREFIX = "aside-"


def _iterations(save_dir) -> list:
    """The iterations of the ``iter_NNNNNNN`` directories in ``save_dir``, oldest first."""
    return sorted(int(n[5:]) for n in os.listdir(str(save_dir))
                  if n.startswith("iter_") and n[5:].isdigit() and os.path.isdir(os.path.join(str(save_dir), n)))


def damage(path):
    """Why Bridge checkpoint directory ``path`` cannot be resumed from (a save cut off, a file cut short), or None."""
    missing = [f for f in COMPLETE_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        return f"incomplete: no {', '.join(missing)} (its save was cut off)"
    if os.path.getsize(os.path.join(path, "train_state.pt")) == 0:
        return "incomplete: train_state.pt is empty"
    return _preflight().dcp_short_file(path)  # the shards against torch's .metadata: the pre-flight's check


def _preflight():
    """The pre-flight module (its :func:`dcp_short_file`): the run dir's copy ``vdkit_preflight.py`` beside this job
    on sys.path in the container, else vdkit's own (as ``bridge_job.py`` finds it)."""
    import importlib

    try:
        return importlib.import_module("vdkit_preflight")
    except ImportError:
        return importlib.import_module("vdkit.recipes.common.preflight")


def _set_aside(save_dir, name) -> str:
    """Rename ``save_dir/name`` out of Bridge's way; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = f"{ASIDE_PREFIX}{name}{DAMAGED_MARK}{stamp}", 1
    while os.path.exists(os.path.join(str(save_dir), target)):
        n += 1
        target = f"{ASIDE_PREFIX}{name}{DAMAGED_MARK}{stamp}.{n}"
    os.replace(os.path.join(str(save_dir), name), os.path.join(str(save_dir), target))
    return target


def _write_atomically(path, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def trust_latest(save_dir, say=print) -> int:
    """Before a resume (rank 0, before Bridge initialises: its process-group rendezvous holds the other ranks until
    this is done, and no rank reads a checkpoint before it): set aside every ``iter_*`` newer than the newest
    complete one (:func:`damage`), each said in one line, and point Bridge's tracker and latest_train_state.pt at
    that one (without any left: both set aside, the run starts over). The iteration resumed from (0: none)."""
    if not save_dir or not os.path.isdir(str(save_dir)):
        return 0
    found = _iterations(save_dir)
    good = 0
    for i in reversed(found):
        name = f"iter_{i:07d}"
        why = damage(os.path.join(str(save_dir), name))
        if why is None:
            good = i
            break
        older = [j for j in found if j < i]
        moved = _set_aside(save_dir, name)
        say(f"bridge_job: checkpoint {name} is damaged ({why}): set aside as {moved}; resuming from "
            + (f"iter_{older[-1]:07d}" if older else "step 0 (none is left)"))
    tracker, state = os.path.join(str(save_dir), TRACKER), os.path.join(str(save_dir), LATEST_STATE)
    if good:
        with open(os.path.join(str(save_dir), f"iter_{good:07d}", "train_state.pt"), "rb") as fh:
            want = fh.read()
        if checkpointed_iteration(save_dir) != good:
            _write_atomically(tracker, str(good).encode())
        if not os.path.isfile(state) or open(state, "rb").read() != want:
            _write_atomically(state, want)
    else:
        for path in (tracker, state):
            if os.path.exists(path):
                _set_aside(save_dir, os.path.basename(path))
    return good

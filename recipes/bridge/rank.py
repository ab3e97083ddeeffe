"""``python -m vdkit.recipes.bridge.rank RUN_DIR``: what each rank runs on this machine.

The CPU shim is applied at import (without CUDA), before the ``__main__`` guard: torch_dist's
checkpoint writer spawns children (multiprocessing's *spawn*), which re-import the parent's main module
by name - and so apply the shim too. (Not a package ``__main__``: multiprocessing does not re-import a
main module named ``*.__main__`` in its children, ``multiprocessing/spawn.py`` ``_fixup_main_from_name``.)
Before the shim (which imports torch), :func:`.job.hold_stops`: a stop signal from the first moment on is
kept for Bridge's handler, and the writer's children outlive the USR1 Slurm sends the whole step.
"""
import os
import sys

from vdkit.recipes.bridge import job  # standard library only: quick

# First thing, here and in the spawned children (__mp_main__): a stop signal during start-up is kept, not fatal.
job.hold_stops(forward_term=__name__ == "__main__")
BEAT = None
if __name__ == "__main__":  # the rank itself (not a writer's child) beats from now on: start-up is watched too
    from vdkit.recipes.common.heartbeat import Heartbeat

    BEAT = Heartbeat.from_env(job._rank())

from vdkit.recipes.bridge import cpu_shim  # noqa: E402 (after the stop handlers: it imports torch)

if cpu_shim.needed():
    cpu_shim.apply()

if __name__ == "__main__":
    from vdkit.recipes.bridge.train import main

    code = main(beat=BEAT)
    # torch_dist's checkpoint writer leaves a multiprocessing Manager (spawned child) behind; os._exit
    # below skips multiprocessing's atexit clean-up, so end the children here or they outlive the rank.
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)
    # As the other engines: leave without C++ static destructors (gloo threads can abort a finished
    # rank at exit); logs, TensorBoard, checkpoints and memory.json are closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    if BEAT is not None:
        BEAT.leave()  # os._exit skips atexit, where the heartbeat says 'exit'
    os._exit(code)

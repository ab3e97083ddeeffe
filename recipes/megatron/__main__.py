"""``python -m vdkit.recipes.megatron RUN_DIR``: what each rank runs."""
import os
import sys

from vdkit.recipes.common.heartbeat import leave_all
from vdkit.recipes.megatron.train import main

code = main()
# As the reference engine: leave without C++ static destructors (gloo threads can abort a finished
# rank at exit); logs, TensorBoard, checkpoints and memory.json are closed by now.
sys.stdout.flush()
sys.stderr.flush()
leave_all()  # os._exit skips atexit, where the heartbeat says 'exit' (the watchdog must not blame a rank that left)
os._exit(code)

"""``python -m vdkit.recipes.reference RUN_DIR``: what each rank runs."""
import os
import sys

from vdkit.recipes.common.heartbeat import leave_all
from vdkit.recipes.reference.train import main

code = main()
# Leave without C++ static destructors: with gloo's threads alive they can abort a rank that trained
# to the end ("terminate called without an active exception"), and destroy_process_group() can wait
# forever on rank 0's store once rank 0 has gone. Logs, TensorBoard and checkpoints are closed by now.
sys.stdout.flush()
sys.stderr.flush()
leave_all()  # os._exit skips atexit, where the heartbeat says 'exit' (the watchdog must not blame a rank that left)
os._exit(code)

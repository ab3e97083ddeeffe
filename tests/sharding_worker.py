"""One rank of tests/test_sharding.py: train each run directory in turn in this one process.

The strategies share the process group the first one creates (Fabric and DeepSpeed both adopt an
initialised group), so one pair of processes pays the import cost once for DDP, FSDP and ZeRO-3.
"""
import os
import sys

from vdkit.recipes.reference.train import train

for run_dir in sys.argv[1:]:
    train(run_dir)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # as the engine's __main__: no static destructors with gloo threads alive

"""The planner: model arithmetic, the memory model, the layout search, the time plan, step-time prediction.

Modules, lowest first (imports go one way): :mod:`~vdkit.planner.calibration` (the constants as data),
:mod:`~vdkit.planner.arch` (parameters per architecture and method), :mod:`~vdkit.planner.layout` (the
parallelism rules), :mod:`~vdkit.planner.memory` (bytes per GPU of a Megatron / NeMo layout),
:mod:`~vdkit.planner.predict` and :mod:`~vdkit.planner.predict_hf` (step time),
:mod:`~vdkit.planner.plan` (the layout search, ``make_plan``) and :mod:`~vdkit.planner.sharded` (FSDP /
ZeRO-3), :mod:`~vdkit.planner.checkpoint_policy` and :mod:`~vdkit.planner.timeplan` (wall time,
allocations, ``--time``, checkpoints). Engines may import the arithmetic (arch, layout, memory, the time
plan's helpers), never the search or the prediction (tests/test_imports.py). Nothing is imported here:
``import vdkit.planner.arch`` stays as light as its module.
"""

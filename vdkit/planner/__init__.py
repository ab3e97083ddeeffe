"""The planner: model arithmetic, the memory model, the layout search, the time plan, step-time prediction.

Modules (imports go one way, top to bottom): :mod:`~vdkit.planner.calibration` (the constants as
data), :mod:`~vdkit.planner.arch` (parameters per architecture and method), :mod:`~vdkit.planner.predict`
and :mod:`~vdkit.planner.predict_hf` (step time), :mod:`~vdkit.planner.plan` and
:mod:`~vdkit.planner.sharded` (memory and layout search), :mod:`~vdkit.planner.timeplan` (wall time,
allocations, ``--time``, checkpoint cadence). Nothing is imported here: ``import vdkit.planner.arch``
stays as light as its module.
"""

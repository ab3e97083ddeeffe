"""What a job runs: the engines and what they share.

Here: the engine registry (engines.py) and the engine spec (spec.py); then one package per engine:
``nemo`` (nemo/: NeMo 1.x's config, its contract, the heartbeat callback, the start-up check in
nemo/runcheck/), ``reference`` (reference/: Lightning + transformers + peft), ``megatron`` (megatron/:
megatron-core), ``bridge`` (bridge/: Megatron-Bridge's own loop). What they share is common/: data
reading, rank discovery, LR schedule, checkpoint naming, heartbeat, preemption, progress lines,
pre-flight, training constants, known warnings, ROCm; for the megatron and bridge engines mcore_cpu.py
(the pinned megatron-core CPU shim) and mcore_memory.py (measured vs planned bytes); data preparation
(dataprep.py, data_stats.py, packing.py, json_records.py).
"""

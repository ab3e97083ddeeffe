"""What a job runs: the engines and what they share.

The engine registry (engines.py) names each engine: ``nemo`` (nemo.py, NeMo 1.x's config:
nemo_config.py, nemo_contract.py), ``reference`` (reference/: Lightning + transformers + peft),
``megatron`` (megatron/: megatron-core), ``bridge`` (bridge/: Megatron-Bridge's own loop). What they
share: common/ (data reading, rank discovery, LR schedule, checkpoint naming), preemption.py,
progress.py, training_constants.py, known_warnings.py; the megatron and bridge engines also
mcore_cpu.py (the pinned megatron-core CPU shim) and mcore_memory.py (measured vs planned bytes).
Data preparation: data.py, data_stats.py, packing.py.
"""

"""What the kit's own engines share, so that no engine imports another.

- :mod:`.data`: reading the training data (tokenizer, NeMo-format JSONL samples or synthetic rows,
  packing, batch order, collation) and the virtual-token count P-tuning adds;
- :mod:`.distributed`: who this rank is (rank, world size, rendezvous) from the launcher's variables;
- :mod:`.schedule`: the learning-rate schedule (NeMo's CosineAnnealing);
- :mod:`.checkpoint`: checkpoint naming, the latest checkpoint, how many are kept.

Preemption (:mod:`vdkit.recipes.common.preemption`) and progress lines (:mod:`vdkit.recipes.common.progress`) are
shared the same way. An engine package imports from here and from the core, never from another engine.
"""

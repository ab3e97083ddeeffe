"""`vdkit check`, engine=bridge: what Megatron-Bridge 0.3.1 will load from where, and the tokenizer it builds.

Bridge decides at start-up (``training/setup.py`` ``setup``, ``training/checkpointing.py`` ``load_checkpoint``):

- PEFT: the pre-wrap hook loads the base weights from ``checkpoint.pretrained_checkpoint`` on every start
  (``setup.py:399``, ``finetune=True``: no optimizer, RNG or iteration), then applies the adapters; where
  ``checkpoint.load`` holds a checkpoint (``checkpoint_exists``) it then resumes from it with ``finetune=False``
  (``setup.py:256``): the adapters, optimizer (``load_optim``), RNG (``load_rng``) and iteration;
- otherwise: ``checkpoint.load`` where it holds a checkpoint (resume: weights, optimizer, RNG, iteration), else
  ``checkpoint.pretrained_checkpoint`` where it does (``checkpointing.py:1342``: ``finetune=True``, weights only,
  iteration 0), else nothing - random initial weights (``setup.py:262``).

A decision that is not what the method needs is a defect (one line each): a fine-tune with no base, a load directory
that is not this run's save directory (a restart resumes another run, or never its own), the base as the load
directory (a fine-tune "resumes" the base's optimizer and iteration), ``finetune: true`` on a full run (every
restart starts over at iteration 0: ``checkpointing.py:1685``), a save with optimizer / RNG state its resume does not
load (``checkpointing.py:1722`` / ``:1765``). The tokenizer line: ``tokenizer_type`` and ``tokenizer_model`` as
Bridge's ``build_tokenizer`` takes them and the vocabulary the model gets (``setup.py``
``_validate_and_set_vocab_size``; padded only when bridge.yaml leaves ``model.vocab_size`` unset).
"""
from __future__ import annotations

import os
from pathlib import Path



class _Holder:
    """A ConfigContainer's stand-in holding only ``checkpoint`` (what the job's flag function reads and sets)."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint


def _same(a, b) -> bool:
    return a is not None and b is not None and os.path.normpath(str(a)) == os.path.normpath(str(b))


def _exists(path) -> str:
    """Bridge's own ``checkpoint_exists`` where ``path`` is on this machine: 'holds a checkpoint' / 'holds none
    yet'; '' where it is not here (cluster storage)."""
    from megatron.bridge.training.utils.checkpoint_utils import checkpoint_exists

    if path is None or not Path(str(path)).exists():
        return ""
    return "holds a checkpoint" if checkpoint_exists(str(path)) else "holds none yet"


def decisions(cfg, plan, rep) -> None:
    """The load decision Bridge will take, as a line; each decision that defeats the method or the kit's restart, a
    defect. ``cfg``: the ConfigContainer as loaded (before ``validate()``)."""
    import copy

    from vdkit.recipes.bridge.job import weights_only_at_the_end

    c = copy.deepcopy(cfg.checkpoint)
    weights_only_at_the_end(_Holder(c))  # the job's own flags (bridge_job.py): a resume's save keeps its state
    peft = cfg.peft is not None
    method = plan.recipe.method.name
    base, load, save = c.pretrained_checkpoint, c.load, c.save
    here = _exists(load)
    resume = (f"a restart resumes from checkpoint.load {load}" + (f" (here: {here})" if here else "")
              + f" with optimizer {'yes' if c.load_optim else 'no'}, RNG {'yes' if c.load_rng else 'no'}, its iteration")
    if peft:
        line = (f"Bridge's load ({c.ckpt_format}): every start loads the base weights from {base} (setup.py:399, "
                f"finetune=True), applies {type(cfg.peft).__name__}; {resume} (setup.py:256)")
    else:
        line = (f"Bridge's load ({c.ckpt_format}): {resume}; " + (
            f"else the base weights from {base} (checkpointing.py:1342, finetune=True: iteration 0, no optimizer); "
            f"neither holding one, random initial weights (setup.py:262; the rank's pre-flight refuses a missing base)"
            if base is not None else "else random initial weights (setup.py:262)"))
    rep.checked(line if load is not None else f"Bridge's load ({c.ckpt_format}): checkpoint.load is null")
    fix = "re-render the run (vdkit render): it sets checkpoint.load = checkpoint.save = the run's checkpoints"
    if method != "pretrain" and not peft and base is None:
        rep.defect(f"method={method} fine-tunes a base but checkpoint.pretrained_checkpoint is null: where "
                   "checkpoint.load holds no checkpoint Bridge loads nothing (setup.py:262) and the first start trains "
                   "from random initial weights", "checkpoint.pretrained_checkpoint",
                   "set it to the base's Bridge checkpoint (model.megatron_path), or re-render the run")
    if load is not None and base is not None and _same(load, base):
        rep.defect(f"checkpoint.load is the base {base}: Bridge resumes from it as this run's own (it holds a checkpoint: "
                   "finetune stays False, checkpointing.py:1342): the base's iteration, and its optimizer and RNG state where it has them",
                   "checkpoint.load", fix)
    elif save is not None and not _same(load, save):
        rep.defect(f"checkpoint.load {load or 'null'} is not checkpoint.save {save}: " + (
            "a restart never finds this run's saves (checkpoint_exists(None) is False, setup.py:256/262) and starts "
            "over" if load is None else
            "a start resumes that directory's checkpoint (checkpointing.py:1338) - another run's - and a restart "
            "never its own"), "checkpoint.load", fix)
    if getattr(c, "finetune", False) and not peft:
        rep.defect("checkpoint.finetune=true on a full run: every load, a restart's resume included, sets the "
                   "iteration to 0 and skips the optimizer and RNG state (checkpointing.py:1685, :1722): each restart "
                   "trains from step 0 again", "checkpoint.finetune",
                   "remove it (Bridge sets it itself for the base's load)")
    for saved, loaded, line in (("save_optim", "load_optim", 1722), ("save_rng", "load_rng", 1765)):
        if getattr(c, saved, True) and not getattr(c, loaded, True):
            rep.defect(f"checkpoint.{saved}=true but {loaded}=false: a restart resumes without the state its "
                       f"checkpoint holds (checkpointing.py:{line})", f"checkpoint.{loaded}", f"set {loaded}: true")


def tokenizer_line(cfg, plan, tok, rep) -> None:
    """The tokenizer Bridge's ``build_tokenizer`` builds from bridge.yaml and the vocabulary the model gets; a
    SentencePiece type given a directory, or a model vocabulary below the tokenizer's, is a defect."""
    from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

    from megatron.bridge.training.tokenizers.utils import SP_TOKENIZERS

    t, m = cfg.tokenizer, cfg.model
    name = str(t.tokenizer_model or "")
    if t.tokenizer_type in SP_TOKENIZERS and not name.endswith(".model"):
        rep.defect(f"tokenizer.tokenizer_type={t.tokenizer_type} reads a SentencePiece model file, tokenizer_model is "
                   f"{name or 'null'} (training/tokenizers/utils.py:51: the sentencepiece library on tokenizer_model)",
                   "tokenizer.tokenizer_type", "HuggingFaceTokenizer for a model directory (the render's), or a "
                   "tokenizer.model path")
        return
    tp = m.tensor_model_parallel_size
    if m.vocab_size is None:
        size = tok.vocab_size if tok is not None else plan.recipe.model.vocab_size
        vocab = (f"model.vocab_size unset: the tokenizer's {size:,}, padded to "
                 f"{calculate_padded_vocab_size(size, m.make_vocab_size_divisible_by, tp, False):,} "
                 f"(multiple of {m.make_vocab_size_divisible_by} x TP {tp}, gpt_provider.py:246)")
    else:
        vocab = f"model.vocab_size {m.vocab_size:,} as set (no padding, setup.py:488)"
        if tok is not None and m.vocab_size < tok.vocab_size:
            rep.defect(f"model.vocab_size {m.vocab_size:,} is below the tokenizer's {tok.vocab_size:,}: Bridge's "
                       "_validate_and_set_vocab_size raises (training/setup.py:484)", "model.vocab_size",
                       f"at least {tok.vocab_size:,} (the plan's model has {plan.recipe.model.vocab_size:,})")
            return
    rep.checked(f"tokenizer: Bridge's build_tokenizer({t.tokenizer_type}, {name or 'null'}"
                f"{', legacy' if getattr(t, 'legacy_tokenizer', False) else ''}); {vocab}")

"""Micro batches for megatron-core, from the kit's samples (recipes/common/data.py).

The samples, the prompt template and loss mask, packing and the step -> samples order are the
reference engine's (one definition for both engines); this module only shapes them the way
megatron's GPTModel wants them: ``tokens`` / ``labels`` shifted by one, ``loss_mask`` where a
label counts, and a block-causal ``attention_mask`` for packed sequences (samples in one row never
see each other; rotary embeddings are relative, so positions need no restart).

Every micro batch of a step is padded to one length - the longest sample in the whole global
batch, rounded up to a multiple of :data:`PAD_MULTIPLE` - so that pipeline stages exchange
tensors of one shape, sequence parallelism can split it, and every layout (whatever its DP) pads
the same step to the same length. Right padding carries no loss and, under causal attention,
changes no real token's output.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

from vdkit.errors import UserError

PAD_MULTIPLE = 8


def step_length(samples, order, step: int, virtual: int, tp: int) -> int:
    """The padded sequence length of global step ``step`` (same for every rank and layout)."""
    longest = 0
    for r in range(order.dp):
        for micro in order.micro_batches(step, r):
            longest = max(longest, max(len(samples[i].ids) for i in micro))
    n = longest - 1 + virtual  # inputs are ids[:-1]; virtual-token placeholders in front
    multiple = PAD_MULTIPLE * tp // math.gcd(PAD_MULTIPLE, tp)
    return int(math.ceil(n / multiple) * multiple)


def micro_batch(samples: Sequence, length: int, pad_id: int, virtual: int) -> Dict[str, object]:
    """One micro batch as megatron tensors (CPU): tokens, labels, loss_mask, position_ids, attention_mask."""
    import torch

    from vdkit.recipes.common.data import IGNORE

    b = len(samples)
    tokens = torch.full((b, length), pad_id, dtype=torch.long)
    labels = torch.zeros((b, length), dtype=torch.long)
    mask = torch.zeros((b, length), dtype=torch.float)
    packed = samples[0].positions is not None
    attn = torch.ones((b, 1, length, length), dtype=torch.bool) if packed else None  # True: masked out
    for i, s in enumerate(samples):
        ids, lab = list(s.ids[:-1]), list(s.labels[1:])
        n = len(ids)
        tokens[i, virtual:virtual + n] = torch.tensor(ids)
        tgt = torch.tensor(lab)
        keep = tgt != IGNORE
        labels[i, virtual:virtual + n] = torch.where(keep, tgt, torch.zeros_like(tgt))
        mask[i, virtual:virtual + n] = keep.float()
        if packed:
            # sample boundaries: a position restarts at 0 where a new sample begins
            starts = [j for j, p in enumerate(s.positions[:-1]) if p == 0] + [n]
            for a, z in zip(starts[:-1], starts[1:]):
                attn[i, 0, a:z, a:z] = ~torch.tril(torch.ones((z - a, z - a), dtype=torch.bool))
            # padding rows attend to themselves only (no NaN from an all-masked softmax row)
            for j in range(n, length):
                attn[i, 0, j, j] = False
    positions = torch.arange(length, dtype=torch.long).unsqueeze(0).expand(b, -1).contiguous()
    return {"tokens": tokens, "labels": labels, "loss_mask": mask, "position_ids": positions, "attention_mask": attn}


def step_micro_batches(samples, order, step: int, dp_rank: int, pad_id: int, virtual: int, tp: int) -> List[dict]:
    """This data-parallel rank's micro batches of global step ``step``."""
    length = step_length(samples, order, step, virtual, tp)
    return [micro_batch([samples[i] for i in idx], length, pad_id, virtual)
            for idx in order.micro_batches(step, dp_rank)]


def data_room(recipe) -> int:
    """The positions a sample may fill next to P-tuning's virtual tokens (UserError when the settings leave none, or
    pack P-tuning samples); the job's first data rule, which `vdkit check` runs too."""
    from vdkit.recipes.common.data import virtual_tokens

    virtual = virtual_tokens(recipe)
    room = recipe.train.seq_length - virtual
    if room < 4:
        raise UserError(f"train.seq_length={recipe.train.seq_length} leaves no room next to {virtual} virtual tokens",
                        "raise train.seq_length or lower method.ptuning_virtual_tokens")
    if recipe.data.packed and virtual:
        raise UserError("the megatron engine cannot pack sequences for P-tuning (virtual tokens would cross "
                        "sample boundaries)", "set data.packed=false for method=ptuning")
    return room

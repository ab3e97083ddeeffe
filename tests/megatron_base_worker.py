"""One rank of tests/test_megatron_base.py: the megatron engine's model built from a Hugging Face base, its logits
beside transformers' own on the same tokens, at TP1, TP2 and PP2 (2 ranks, gloo, the CPU shim applied).

    RANK=r WORLD_SIZE=2 MASTER_PORT=p python tests/megatron_base_worker.py OUT_JSON HF_DIR[,OVERRIDE...] ...

Rank 0 writes {HF_DIR: {"diffs": {layout: largest |megatron - transformers| logit difference}, "scale": largest
|logit|}} to OUT_JSON.
"""
from __future__ import annotations

import json
import os
import sys


def main(out: str, *models: str) -> None:
    import torch
    import torch.distributed as dist

    from vdkit.recipes.common import mcore_cpu

    mcore_cpu.apply()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world)
    found = {}
    for model in models:
        hf_dir, *overrides = model.split(",")
        found[hf_dir] = compare(hf_dir, overrides, rank, world)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(found, fh)
    dist.destroy_process_group()


def compare(hf_dir: str, overrides, rank: int, world: int) -> dict:
    """Largest logit difference per layout, and the largest logit, for one HF model."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from transformers import AutoModelForCausalLM

    from vdkit.composition.config import compose
    from vdkit.recipes.megatron.base import load
    from vdkit.recipes.megatron.model import Layout, build_chunks

    recipe = compose(["engine=megatron", "model=tiny_llama", "method=lora", f"model.hf_path={hf_dir}", *overrides])
    vocab = recipe.model.vocab_size
    tokens = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)(tokens).logits
    diffs = {}
    for name, tp, pp in (("tp1", 1, 1), ("tp2", 2, 1), ("pp2", 1, 2)):
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        model_parallel_cuda_manual_seed(0)
        layout = Layout(tp=tp, pp=pp, vp=None, sequence_parallel=False, distributed_optimizer=False, recompute="none")
        [model] = build_chunks(recipe, layout, cuda=False, load_base=lambda m: load(m, recipe, hf_dir))
        model.eval()
        with torch.no_grad():
            if pp > 1 and ps.is_pipeline_first_stage():  # [s, b, h] to the next stage
                dist.send(model(tokens, positions, None).contiguous(), dst=1)
                got = None
            else:
                if pp > 1:
                    hidden = torch.empty(tokens.shape[1], tokens.shape[0], recipe.model.hidden_size)
                    dist.recv(hidden, src=0)
                    model.set_input_tensor(hidden)
                got = model(tokens, positions, None)  # [b, s, vocab / tp]
                if tp > 1:
                    parts = [torch.empty_like(got) for _ in range(tp)]
                    dist.all_gather(parts, got.contiguous(), group=ps.get_tensor_model_parallel_group())
                    got = torch.cat(parts, dim=-1)
        gathered = [None] * world
        dist.all_gather_object(gathered, None if got is None else float((got[..., :vocab] - want).abs().max()))
        diffs[name] = max(g for g in gathered if g is not None)
        ps.destroy_model_parallel()
    return {"diffs": diffs, "scale": float(want.abs().max())}


if __name__ == "__main__":
    main(*sys.argv[1:])

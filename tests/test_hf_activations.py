"""The reference engine's plans count what its transformers layers save for backward, counted live.

The engine's own model (recipes/reference/model.py ``build_model``: a 3-layer tiny Llama with grouped-query
attention, and an OPT) runs one forward under torch's saved-tensor hooks (dedupe by storage,
vdkit.recipes.megatron.activations.saved_bytes_per_layer) in each way the engine computes - fp32 (every strategy on a
CPU), bf16 autocast over fp32 weights (DDP on GPUs, emulated with the CPU's autocast: the same casts), bf16 weights
(FSDP / ZeRO-3) - for the attention implementations (sdpa, eager) and gradient-checkpointing modes it renders, and
SFT, LoRA and P-tuning. The plans' bytes per layer must be within 5 % (they agree to the byte but for OPT's LayerNorm
statistics, which a GPU keeps in fp32 and the CPU in bf16). Layer 0 also holds the model's shared RoPE table and,
under PEFT, keeps a little less (its input needs no gradient): layers 1.. are compared.
"""
from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from vdkit.composition.config import compose  # noqa: E402
from vdkit.composition.schema import GB  # noqa: E402

TOL = 0.05
SEQ, H, F, HEADS, GROUPS, LAYERS = 64, 64, 160, 8, 2, 3
TOK = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2)


def _recipe(arch, method, attention, recompute, cluster="xe9680", sharding="none"):
    """The engine's recipe; composed once per model, method and cluster (Hydra's composition is the slow part), the
    attention, recompute and sharding set on the composed recipe."""
    r = _composed(arch, method, cluster)
    r = dataclasses.replace(r, engine=dataclasses.replace(r.engine, attention=attention))
    return r.with_parallelism(recompute=recompute, sharding=sharding)


@functools.lru_cache(maxsize=None)
def _composed(arch, method, cluster):
    groups = GROUPS if arch == "llama" else HEADS  # OPT has no grouped-query attention
    return compose(["engine=reference", f"model=tiny_{arch}", f"method={method}", "data=synthetic",
                    f"model.num_layers={LAYERS}", f"model.hidden_size={H}", f"model.ffn_hidden_size={F}",
                    f"model.num_attention_heads={HEADS}", f"model.num_query_groups={groups}",
                    f"train.seq_length={SEQ}", "train.micro_batch_size=1", "train.global_batch_size=8",
                    f"cluster={cluster}"])


def _measure(r, regime):
    """Bytes each decoder layer of the engine's model saves in one training forward of one full row."""
    import torch

    from vdkit.recipes.megatron.activations import saved_bytes_per_layer
    from vdkit.recipes.reference.model import build_model

    model = build_model(r, TOK)
    if regime == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.model.decoder if r.model.arch == "opt" else base.model
    final = decoder.final_layer_norm if r.model.arch == "opt" else decoder.norm
    ids = torch.randint(3, r.model.vocab_size, (1, SEQ))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime == "autocast"):
            return model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)

    return saved_bytes_per_layer(decoder.layers, list(model.parameters()), forward, [final, base.lm_head])


def _plan_per_layer(r, recompute):
    """The DDP plan's activation bytes per layer (PP 1: every layer once, plus the logits; full recompute: the
    stored layers plus one recomputed)."""
    from vdkit.planner.memory import estimate_memory

    s = SEQ + (r.method.ptuning_virtual_tokens if r.method.name == "ptuning" else 0)
    acts = estimate_memory(r, 1, 1, 1, False, recompute, False).activations_gb * GB
    # the logits the loss keeps: bf16 + its fp32 copy on a GPU, one fp32 buffer on a CPU
    acts -= (4.0 if r.cluster.gpu_type == "cpu" else 6.0) * s * r.model.vocab_size
    return acts / LAYERS if recompute == "none" else acts / (LAYERS + 1)


CASES = [(arch, method, attention) for arch in ("llama", "opt") for method in ("sft", "lora", "ptuning")
         for attention in ("sdpa", "eager")]
# fp32 (the CPU) changes only the bytes of an element and drops autocast's casts: each method and attention once
FP32_CASES = [case for i, case in enumerate(CASES) if i % 4 in (0, 3)]


@pytest.mark.parametrize("cluster, regime", [("xe9680", "autocast"), ("local", "fp32")])
def test_ddp_plan_counts_the_layers_the_engine_runs(cluster, regime):
    """sharding=none: on GPUs (xe9680) DDP under bf16 autocast over the fp32 model, with the bf16 casts of the fp32
    weights each linear saves (LoRA's adapters' too); on a CPU cluster (local) fp32. Before, the plan counted
    Transformer Engine's fused layers in bf16 whatever the engine ran."""
    for arch, method, attention in CASES if regime == "autocast" else FP32_CASES:
        r = _recipe(arch, method, attention, "none", cluster)
        planned = _plan_per_layer(r, "none")
        for got in _measure(r, regime)[1:]:
            assert abs(got - planned) <= TOL * planned, (arch, method, attention, regime, got, planned)


def test_full_recompute_keeps_each_layers_input():
    """Gradient checkpointing (transformers' non-reentrant): a layer keeps its fp32 input under autocast; the plan
    adds one recomputed layer's working set."""
    for arch, method in (("llama", "lora"), ("opt", "sft")):
        r = _recipe(arch, method, "sdpa", "full")
        kept = SEQ * H * 4  # the layer's fp32 input
        for got in _measure(r, "autocast")[1:]:
            assert got == kept
        working = _plan_per_layer(_recipe(arch, method, "sdpa", "none"), "none")
        assert _plan_per_layer(r, "full") * (LAYERS + 1) == pytest.approx(LAYERS * kept + working)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_sharded_plans_count_the_same_layers_in_bf16(arch):
    """FSDP / ZeRO-3 compute in bf16 weights (no autocast): vdkit.planner.sharded's bytes per layer are the same
    formula's, measured on the bf16 model. Before: Korthikanti's 34sbh-style count with dropout masks."""
    from vdkit.planner.calibration import memory
    from vdkit.planner.sharded import activation_bytes_per_layer, estimate_sharded_memory

    for method in ("sft", "lora", "ptuning"):
        for attention in ("sdpa", "eager"):
            for recompute in ("none", "full") if (method, attention) == ("sft", "sdpa") else ("none",):
                r = _recipe(arch, method, attention, recompute, sharding="fsdp")
                planned = activation_bytes_per_layer(r)
                if recompute == "full":  # every layer its input, one recomputed, the logits
                    s = SEQ + (r.method.ptuning_virtual_tokens if method == "ptuning" else 0)
                    acts = estimate_sharded_memory(r, "full")[0].activations_gb * GB
                    acts -= planned + float(memory()["logit_bytes"]) * SEQ * r.model.vocab_size
                    planned = acts / LAYERS
                    assert planned == pytest.approx(s * H * 2)  # the bf16 input
                for got in _measure(r, "bf16")[1:]:
                    assert abs(got - planned) <= TOL * planned, (method, attention, recompute, got, planned)


TARGET_SETS = (("linear_qkv", "linear_proj"), ("linear_fc1",), ("linear_fc2",),
               ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_lora_targets_adapters_keep_what_the_plan_counts(arch):
    """method.lora_targets beyond QKV (peft's o_proj / out_proj, gate_proj + up_proj / fc1, down_proj / fc2), in fp32
    and under autocast: each adapter's A output, and its input where no other op keeps that tensor (a cast copy under
    autocast). Layers 2.. are compared: without a QKV adapter layer 0's attention needs no gradient, so the shared
    RoPE table is first saved by layer 1."""
    for cluster, regime in (("local", "fp32"), ("xe9680", "autocast")):
        base = _composed(arch, "lora", cluster)
        for targets in TARGET_SETS:
            r = dataclasses.replace(base, method=dataclasses.replace(base.method, lora_targets=list(targets)))
            r = r.with_parallelism(recompute="none", sharding="none")
            planned = _plan_per_layer(r, "none")
            for got in _measure(r, regime)[2:]:
                assert abs(got - planned) <= TOL * planned, (arch, regime, targets, got, planned)

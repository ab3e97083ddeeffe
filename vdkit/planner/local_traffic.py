"""What megatron-core's local layer spec costs in step time beyond its GEMMs: HBM traffic and attention's bmm FLOPs.

An engine whose spec says ``layer_kernels="local"`` (the megatron engine: megatron-core's local spec on GPUs too, no
Transformer Engine; vdkit.planner.activations counts what it keeps) runs every norm, RoPE, SwiGLU and the attention
unfused: each is a chain of separate kernels, each reading its inputs from HBM and writing its output back, and the
attention materialises the ``s x s`` scores. The step-time model's compute term (vdkit.planner.predict) prices the
GEMMs; this module prices the rest, per layer and micro batch, counted tensor by tensor from megatron-core 0.16.1's
local modules as they run in bf16 (``TransformerConfig(bf16=True)``, every ``*_fusion`` off, dropout 0), under torch's
own decompositions. Checked op by op against a live count (:mod:`vdkit.recipes.megatron.traffic`, a dispatch mode
over one layer's forward and backward; tests/test_local_traffic.py at TP 1, tests/test_activation_memory.py's two gloo
ranks at TP 2 with and without sequence parallelism, its collectives left to the communication term): equal to the
byte, but for the selective checkpoint's gradient copies autograd may skip (below).

Shapes on one GPU: ``s`` the row the engine builds (:func:`row_length`), ``b`` the micro batch, ``h`` hidden, ``d``
the head dim, ``a`` heads and ``g`` query groups, ``t`` TP; ``X = sbh n`` the residual stream (``n = 1/t`` under
sequence parallelism, else 1), ``Q = sbh / t`` (query, context), ``K = s b g d / t`` (key, value), ``F = s b f / t``
(one SwiGLU half), ``S = b (a / t) s^2`` the score elements. Bytes, each kernel reading its inputs once and writing
its output once (the least it must move; L2 reuse and multi-pass kernels are not assumed either way):

- torch's RMSNorm (composite ``rms_norm``: upcast, ``pow``, ``mean``, ``add_``, ``rsqrt``, two ``mul``, downcast):
  forward ``40X + 24 sb n + 2h``; backward (autograd through the same ops, the weight's gradient included)
  ``104X + 40 sb n + 12h``; two per layer;
- residual adds: ``6X`` each forward, and the two gradient accumulations backward, ``6X`` each;
- attention forward (megatron-core's ``DotProductAttention`` + ``FusedScaleMaskSoftmax.forward_torch_softmax``):
  ``baddbmm`` writes the bf16 scores (``2S``; beta 0: its buffer is not read) reading Q and the key (``4Q``), the
  fp32 upcast (``6S``), the causal mask rebuilt on every call (``torch.triu(torch.ones(s, s))`` then ``.bool()``,
  ``17 s^2``), ``masked_fill_`` in place (``8S + s^2``), softmax (``8S``), the bf16 cast (``6S``), ``bmm`` with V
  (``2S + 4Q``), the context made contiguous (``4Q``): ``32S + 18 s^2 + 12Q`` (packed rows come with a
  block-causal mask, read rather than built: not told apart); under GQA the query reshaped out of the fused QKV
  output is a copy when a GPU holds more than one group (``4Q``), and K and V are repeated to every head
  (``repeat_interleave``: ``4Q + 4K``);
- attention backward: ``bmm`` for dV and dP (``2S + 4Q`` each), the cast back (``6S``), softmax backward (``12S``),
  the mask (``8S + s^2``), the cast (``6S``), ``bmm`` for dQ and dK (``2S + 4Q`` each) and their scaling (``4Q``
  each), dQ, dK, dV gathered into the QKV layout (``4Q + 8K``); with GQA the repeats summed back (``4Q + 4K``):
  ``40S + s^2 + 28Q + 8K``;
- RoPE (``apply_rotary_pos_emb_bshd``, unfused): ``24Q + 24K`` forward and ``28Q + 28K`` backward (its
  ``t[..., rot_dim:]`` slice writes a zero gradient the size of Q and of K), plus the cos / sin tables
  recomputed per call, ``96 s d`` forward and ``8 s d`` backward;
- SwiGLU (``silu(x) * (x_linear + offset)``): ``14F`` forward, ``26F`` backward;
- selective recompute reruns the attention forward above (``32S + 18 s^2 + 12Q``, the GQA repeats), and autograd
  may copy the gradients of the checkpoint's inputs (AccumulateGrad's ``clone_obey_contract``, when a gradient's
  layout differs from its input's or another reference holds it): dQ (``4Q``), and without GQA dK and dV too
  (``8K``) - counted, though a run may skip some (seen from run to run on the CPU; ``autograd_copies``); full
  recompute reruns the whole forward.

The forward's writes keep what vdkit.planner.activations counts as saved (fp32 softmax output and its bf16 cast:
``6S`` of the ``16S`` written), a lower bound the count meets. The linears' GEMMs are the compute term's; the
attention's ``bmm`` FLOPs are priced here too (:func:`attention_flops`): the local spec computes the whole ``s x
s`` square, forward, backward (2x) and recomputed, for every method (attention has no weights: LoRA and P-tuning
need its input gradients), while the compute term counts ``4 h x span`` per token over its passes.

Frozen base weights (LoRA, P-tuning) skip the norms' weight gradients (``16X + 10h`` less per norm); LoRA's
adapters (rank-``r`` GEMMs and one add on QKV's output) are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerTraffic:
    """HBM bytes one local-spec layer moves for one micro batch, by pass."""

    forward: float
    backward: float
    recomputed: float
    scores: float  # the part that scales with s^2 (all passes)
    # of `recomputed`, the checkpoint's input-gradient copies: autograd's AccumulateGrad makes each only when the
    # gradient's layout or a live reference to it asks (clone_obey_contract), so a run may move up to this much less
    autograd_copies: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recomputed


def _shapes(m, s: float, b: int, tp: int, sequence_parallel: bool):
    h, a, g = m.hidden_size, m.num_attention_heads, m.num_query_groups
    d = h // a
    n = 1.0 / tp if sequence_parallel and tp > 1 else 1.0
    return dict(X=s * b * h * n, sbn=s * b * n, h=h, Q=s * b * h / tp, K=s * b * g * d / tp,
                F=s * b * m.ffn_hidden_size / tp, S=b * (a / tp) * s * s, ss=s * s, sd=s * d,
                gqa=a > g, reshape_copy=a > g and g // tp > 1)


def _attention_forward(x) -> tuple:
    """(bytes, of which s^2) of the core attention's forward (DotProductAttention + the torch softmax)."""
    s2 = 32 * x["S"] + 18 * x["ss"]
    return s2 + 12 * x["Q"] + (4 * x["Q"] + 4 * x["K"] if x["gqa"] else 0.0), s2


def layer_traffic(m, s: float, b: int, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                  frozen: bool = False) -> LayerTraffic:
    """HBM bytes of one bf16 local-spec layer (RMSNorm, SwiGLU, RoPE) per micro batch of ``b`` rows of ``s`` tokens
    (the module docstring); ``recompute``: none / selective / full; ``frozen``: the base weights (LoRA, P-tuning)."""
    x = _shapes(m, s, b, tp, sequence_parallel)
    X, Q, K = x["X"], x["Q"], x["K"]
    norm_fwd = 40 * X + 24 * x["sbn"] + 2 * x["h"]
    norm_bwd = 104 * X + 40 * x["sbn"] + 12 * x["h"] - ((16 * X + 10 * x["h"]) if frozen else 0.0)
    attn_fwd, s2_fwd = _attention_forward(x)
    attn_fwd += 4 * Q if x["reshape_copy"] else 0.0
    rope_fwd = 24 * Q + 24 * K + 96 * x["sd"]
    forward = 2 * norm_fwd + 2 * 6 * X + attn_fwd + rope_fwd + 14 * x["F"]
    s2_bwd = 40 * x["S"] + x["ss"]
    attn_bwd = s2_bwd + 28 * Q + 8 * K + (4 * Q + 4 * K if x["gqa"] else 0.0)
    backward = 2 * norm_bwd + 2 * 6 * X + attn_bwd + 28 * Q + 28 * K + 8 * x["sd"] + 26 * x["F"]
    copies = 0.0
    if recompute == "full":
        recomputed, s2_rec = forward, s2_fwd
    elif recompute == "selective":
        again, s2_rec = _attention_forward(x)
        copies = 4 * Q + (0.0 if x["gqa"] else 8 * K)
        recomputed = again + copies
    else:
        recomputed, s2_rec = 0.0, 0.0
    return LayerTraffic(forward, backward, recomputed, s2_fwd + s2_bwd + s2_rec, copies)


def attention_flops(m, s: float, b: int, tp: int = 1, recomputed: float = 0.0) -> float:
    """The local attention's batched-matmul FLOPs of one layer per micro batch: ``QK^T`` and ``PV`` over the whole
    ``s x s`` square (``4 b s^2 h / t`` forward), twice that backward, and ``recomputed`` forwards again."""
    return 4.0 * b * s * s * m.hidden_size / tp * (3.0 + recomputed)


# ----------------------------------------------------------------------------- in the step
@dataclass(frozen=True)
class LocalStep:
    """What a local-kernel engine's layers add to one micro batch on one GPU's pipeline stage."""

    row: float  # tokens per row the layers compute on (padding and P-tuning's virtual tokens included)
    hbm_bytes: float  # the stage's layers' traffic (forward, backward, recomputed)
    scores_bytes: float  # of which the s x s scores'
    attention_flops: float  # the stage's attention bmm FLOPs
    extra_flops: float  # of which the compute term does not count (its span, its passes)


def row_length(recipe) -> float:
    """Tokens per row a local-kernel engine's layers compute on: ``train.seq_length`` for pretraining and packed rows;
    an unpacked fine-tuning row padded as the engine's collator pads it (its spec's ``pads_rows_to``: the expected
    longest of the micro batch's or of the global batch's rows, vdkit.planner.tokens, from the data's histogram or
    the planner's default spread), P-tuning's virtual tokens in front, at most ``train.seq_length``. (The engine also
    rounds a row up to a multiple of 8 x TP: not counted.)"""
    from vdkit.planner.tokens import full_rows, micro_batch_tokens
    from vdkit.recipes import engines

    t = recipe.train
    if full_rows(recipe):
        return float(t.seq_length)
    over = t.global_batch_size if engines.get(recipe.engine.name).spec.pads_rows_to == "global_batch" else None
    virtual = recipe.method.ptuning_virtual_tokens if recipe.method.name == "ptuning" else 0
    return min(micro_batch_tokens(recipe, padded_over=over).padded_row + virtual, float(t.seq_length))


def local_step(recipe, tp: int, layers: int, recompute: str, share: float, counted_attention_flops: float):
    """The local layers' traffic and attention FLOPs per micro batch on a GPU holding ``layers`` layers at TP ``tp``
    (a :class:`LocalStep`), or None when ``recipe``'s engine builds fused layers (its spec's ``layer_kernels``).
    ``share``: the share of the layers full recompute reruns (vdkit.planner.memory.recompute_share);
    ``counted_attention_flops``: the attention FLOPs the compute term already counts on this GPU per micro batch."""
    from vdkit.planner.layout import effective_sp
    from vdkit.planner.memory import layer_kernels

    if layer_kernels(recipe) != "local":
        return None
    m, p = recipe.model, recipe.parallelism
    s, b = row_length(recipe), recipe.train.micro_batch_size
    # unset means on at TP > 1, as the plan resolves it (layout.effective_sp), also inside the layout search
    sp, frozen = effective_sp(tp, p.sequence_parallel), recipe.method.name in ("lora", "ptuning")
    if recompute == "selective":
        per = layer_traffic(m, s, b, tp, sp, "selective", frozen)
        hbm, scores, again = layers * per.total, layers * per.scores, 1.0
    else:  # none, or full on `share` of the layers: those rerun their forward
        per, rerun = layer_traffic(m, s, b, tp, sp, "none", frozen), layer_traffic(m, s, b, tp, sp, "full", frozen)
        hbm = layers * (per.total + share * rerun.recomputed)
        scores = layers * (per.scores + share * (rerun.scores - per.scores))
        again = share if recompute == "full" else 0.0
    flops = layers * attention_flops(m, s, b, tp, again)
    return LocalStep(s, hbm, scores, flops, max(0.0, flops - counted_attention_flops))


def step_note(step, recipe) -> list:
    """The plan's note on the local layers' share of a predicted step (its parts, vdkit.planner.predict); [] when the
    engine builds fused layers."""
    q = step.parts
    if "local_row" not in q:
        return []
    return [f"local layers (engine={recipe.engine.name}: megatron-core's local spec, layer_kernels=local): "
            f"{q['local_traffic_s']:.3g} s/step of unfused HBM traffic in the overhead "
            f"({q['local_gb_per_micro_batch']:,.0f} GB per micro batch at {q['local_hbm_gb_s']:,.0f} GB/s, "
            f"{q['local_scores_gb_per_micro_batch']:,.0f} GB of it the s x s attention scores) + {q['local_attention_flops_s']:.3g} s/step of attention bmm FLOPs in the compute, "
            f"rows of {q['local_row']:,.0f} tokens (vdkit.planner.local_traffic)"]


def local_parts(local, micro: int, traffic_mb: float, flops_mb: float, hbm: float) -> dict:
    """The local layers' share of the step (:func:`local_step`'s result) for the plan's note - their traffic's and
    their extra attention FLOPs' seconds per step (``traffic_mb``, ``flops_mb``: per micro batch); {} without them."""
    if local is None:
        return {}
    return {"local_row": local.row, "local_gb_per_micro_batch": local.hbm_bytes / 1e9,
            "local_scores_gb_per_micro_batch": local.scores_bytes / 1e9,
            "local_traffic_s": micro * traffic_mb, "local_attention_flops_s": micro * flops_mb,
            "local_hbm_gb_s": hbm / 1e9}

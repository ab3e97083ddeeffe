"""Parameter counts per architecture, from ModelCfg's fields (Llama 2 / 3.1, OPT), and per method.

One formula for every decoder the kit knows, driven by the architecture fields rather than the
model's name, and checked against transformers' own model classes (tests/test_arch.py builds each
conf/model/*.yaml on the meta device and counts):

- attention: Q and O are h x h, K and V h x (KV heads x head dim); biases on all four when
  ``bias`` (OPT), on Q, K and V only when ``qkv_bias`` (Qwen2);
- MLP: SwiGLU has three h x f matrices (gate, up, down), ReLU / GeLU two (fc1, fc2); biases
  f (+ f for a gated MLP) + h when ``bias``;
- norms: two per layer, RMSNorm a weight (h), LayerNorm a weight and a bias (2h); a final norm
  after the last layer only with pre-norm blocks (OPT-350m, post-norm, has none);
- embeddings: the token table V x e (e = ``embedding_dim`` or h) and, when e != h, the two
  bias-free projections e <-> h (OPT-350m); learned absolute positions add (max positions +
  offset) x h (OPT's table has 2 extra rows); the output layer is V x h unless ``tied_embeddings``.
"""
from __future__ import annotations

from dataclasses import dataclass

from vdkit.planner import lora_targets
from vdkit.composition.schema import LORA_DEFAULT_TARGETS

# Rows a learned position table holds beyond max_position_embeddings (OPTLearnedPositionalEmbedding).
LEARNED_POSITION_OFFSET = {"opt": 2}
BF16_BYTES = 2  # one bfloat16 element (the adapters' and TE 1.x's CP ring's buffers: lora_traffic, cp_overheads)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a decoder-only transformer."""

    per_layer: int  # one decoder block (attention + MLP + its norms)
    embedding: int  # the input token table (V x e)
    final_norm: int
    num_layers: int
    output: int = 0  # the output layer (V x h) when untied, else 0
    extra: int = 0  # learned positions and embedding projections

    @property
    def total(self) -> int:
        return self.num_layers * self.per_layer + self.embedding + self.output + self.extra + self.final_norm

    @property
    def tied(self) -> bool:
        """Whether the output layer shares the input embedding."""
        return self.output == 0

    @property
    def positions(self) -> int:
        """Learned position and projection parameters (0 for rotary models)."""
        return self.extra

    @property
    def outside_layers(self) -> int:
        """Everything not in a decoder block (what a per-block FSDP wrap leaves to the root unit)."""
        return self.total - self.num_layers * self.per_layer


def param_counts(m) -> ParamCounts:
    """Parameter counts of ``m`` (a ModelCfg): see the module docstring."""
    h, f, V = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    bias = bool(getattr(m, "bias", False))
    gated = getattr(m, "activation", "swiglu") == "swiglu"
    norm_params = (2 if getattr(m, "norm", "rmsnorm") == "layernorm" else 1) * h
    qkv_bias = bias or bool(getattr(m, "qkv_bias", False))  # Qwen2: q, k and v carry biases, the output projection none
    attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if qkv_bias else 0) + (h if bias else 0)
    mlp = (3 if gated else 2) * h * f + (((2 * f if gated else f) + h) if bias else 0)
    per_layer = attn + mlp + 2 * norm_params
    e = getattr(m, "embedding_dim", None) or h
    extra = 2 * e * h if e != h else 0
    if getattr(m, "position_embedding", "rope") == "learned":
        extra += (m.max_position_embeddings + LEARNED_POSITION_OFFSET.get(getattr(m, "arch", ""), 0)) * h
    final_norm = norm_params if getattr(m, "pre_norm", True) else 0
    output = 0 if getattr(m, "tied_embeddings", False) else V * h
    return ParamCounts(per_layer=per_layer, embedding=V * e, final_norm=final_norm, num_layers=m.num_layers,
                       output=output, extra=extra)


# ----------------------------------------------------------------------------- per method
def lora_params_per_layer(m, adapter_dim: int, qkv: str = "fused", targets=LORA_DEFAULT_TARGETS) -> int:
    """LoRA parameters of one layer, as the engine places them (``engine.lora_qkv``) on ``targets``
    (``method.lora_targets``; vdkit.planner.lora_targets).

    ``fused``: megatron-core, Bridge and NeMo adapt each fused linear (on QKV: A is h x r, B is
    r x (h + 2 kv)). ``separate``: peft adapts q, k and v, each with its own A (h x r) and B (r x h,
    r x kv, r x kv), and a gated MLP's gate and up projections apart."""
    return lora_targets.params_per_layer(m, adapter_dim, tuple(targets), qkv)


def ptuning_params(method, m, tp: int = 1) -> float:
    """P-tuning's prompt encoder (NeMo's PromptEncoderAdapter): a virtual-token embedding (v x e), then
    e -> bottleneck -> h. ``tp`` > 1: what one tensor-parallel rank holds (the linear layers sharded,
    the embedding and the second layer's bias replicated)."""
    v, b, e, h = method.ptuning_virtual_tokens, method.ptuning_bottleneck_dim, method.ptuning_embedding_dim, m.hidden_size
    return v * e + (e * b + b) / tp + b * h / tp + h


def trainable_params(r) -> int:
    """Parameters the method trains: all (sft, pretrain), LoRA where the engine puts it, or the prompt encoder."""
    m = r.model
    if r.method.name == "lora":
        return m.num_layers * lora_params_per_layer(m, r.method.lora_adapter_dim, r.engine.lora_qkv,
                                                    lora_targets.of(r))
    if r.method.name == "ptuning":
        return int(ptuning_params(r.method, m))
    return param_counts(m).total

"""The recipe's model as megatron-core ``GPTModel`` chunks, with the method's trainable parts.

- architecture from ``ModelCfg`` (Llama 2: RMSNorm, SwiGLU MLP, rotary embeddings, grouped-query
  attention, untied embeddings, no biases; also LayerNorm, ReLU / GELU MLPs, biases, learned
  positions, tied embeddings); megatron-core's local layer spec (no Transformer Engine); fp32 on CPU,
  bf16 on GPU; the vocabulary padded as NeMo pads it (a multiple of 128 x TP);
- layout: one chunk per virtual pipeline stage (``parallelism.vp``), each holding its share of layers;
- initial weights are a function of ``train.seed`` and each parameter's *global* name only, the full
  tensor drawn on the CPU and cut to this rank's tensor-parallel shard by megatron-core's own
  splitter, so every layout starts from the same model (what makes layouts comparable step by step);
- lora (NeMo 1.x's default: the fused QKV projection): ``LoraLinear`` wraps a base layer with
  NeMo's ParallelLinearAdapter split - column-parallel base: A column-parallel with its output
  gathered, B column-parallel (outputs stay sharded like the base's); row-parallel base: A
  row-parallel on the sharded input, B column-parallel with its output gathered;
- ptuning: NeMo's PromptEncoderAdapter (embedding -> column-parallel -> GELU -> row-parallel) on the
  first pipeline stage; its output replaces the embeddings of the ``virtual_tokens`` placeholder
  positions at the front of every sample; the base model is frozen.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, List, Optional

from vdkit.errors import UserError
from vdkit.planner import lora_targets

INIT_STD = 0.02  # NeMo / Megatron init_method_std
PTUNING_INIT_STD = 0.023  # NeMo's p_tuning.init_std
#: megatron-core's module name -> how the base layer is split across tensor-parallel ranks
BASE_SPLIT = {name: t.split for name, t in lora_targets.TARGETS.items()}


@dataclass(frozen=True)
class Layout:
    """The parallel layout as megatron-core is told it."""

    tp: int
    pp: int
    vp: Optional[int]  # None unless interleaved (vp > 1)
    sequence_parallel: bool
    distributed_optimizer: bool
    recompute: str
    recompute_num_layers: Optional[int] = None  # full recompute of the first N layers per stage (block)

    @property
    def recompute_keys(self) -> dict:
        """megatron-core's recompute keys (vdkit.planner.recompute), None values left out."""
        from types import SimpleNamespace

        from vdkit.planner import recompute

        keys = recompute.mcore(SimpleNamespace(recompute=self.recompute, recompute_num_layers=self.recompute_num_layers))
        return {k: v for k, v in keys.items() if v is not None}

    @classmethod
    def from_plan(cls, plan) -> "Layout":
        p = plan.recipe.parallelism
        return cls(tp=p.tp, pp=p.pp, vp=p.vp if (p.vp or 1) > 1 else None,
                   sequence_parallel=bool(p.sequence_parallel) and p.tp > 1,
                   distributed_optimizer=bool(p.distributed_optimizer), recompute=p.recompute or "none",
                   recompute_num_layers=p.recompute_num_layers)


def transformer_config(recipe, layout: Layout, cuda: bool):
    """megatron-core's TransformerConfig for the recipe's Llama on this layout."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = recipe.model
    if m.hidden_size % m.num_attention_heads or m.num_attention_heads % m.num_query_groups:
        raise UserError(f"model {m.name}: hidden_size {m.hidden_size}, {m.num_attention_heads} heads and "
                        f"{m.num_query_groups} query groups do not divide evenly",
                        "make hidden_size a multiple of num_attention_heads, and heads a multiple of groups")
    activation = {"swiglu": F.silu, "relu": F.relu, "gelu": F.gelu}[m.activation]
    dtype = torch.bfloat16 if cuda else torch.float32
    return TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        normalization="RMSNorm" if m.norm == "rmsnorm" else "LayerNorm", layernorm_epsilon=m.norm_eps,
        gated_linear_unit=m.activation == "swiglu", activation_func=activation, add_bias_linear=m.bias, add_qkv_bias=m.qkv_bias, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=INIT_STD,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vp, sequence_parallel=layout.sequence_parallel,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=cuda, use_cpu_initialization=not cuda,
        # megatron-core's own init runs (it also marks tensor-parallel parameters); canonical_init then
        # overwrites every value so that all layouts start from the same model.
        perform_initialization=True,
        # Fused kernels are CUDA-only; on a GPU without Transformer Engine / Apex the plain paths are used too.
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        batch_p2p_comm=cuda, **layout.recompute_keys)


def rope_keys(m) -> dict:
    """GPTModel's RoPE scaling arguments (vdkit.planner.context: llama3 with megatron-core's fixed factors, or linear)."""
    from vdkit.planner.context import interpolation_factor, llama3_factor

    if llama3_factor(m):
        return {"rope_scaling": True, "rope_scaling_factor": llama3_factor(m)}
    if interpolation_factor(m):
        return {"seq_len_interpolation_factor": interpolation_factor(m)}
    return {}


# ----------------------------------------------------------------------------- layer spec
def layer_specs(config, vp_stage):
    """megatron-core's local GPT layer spec with sequence-parallel-capable torch norms (shared with the
    bridge engine: :func:`vdkit.recipes.common.mcore_cpu.local_block_spec`)."""
    from vdkit.recipes.common.mcore_cpu import local_block_spec

    return local_block_spec(config, vp_stage)


# ----------------------------------------------------------------------------- adapters
_ADAPTERS: dict = {}


def _adapter_classes():
    """(LoraLinear, PromptEncoder), defined on first use: torch and megatron load lazily."""
    if _ADAPTERS:
        return _ADAPTERS["lora"], _ADAPTERS["prompt"]
    import dataclasses as dc

    import torch
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    def _init_noop(_w):  # weights are set by canonical_init
        return None

    class LoraLinear(torch.nn.Module):
        """A base (column- or row-parallel) linear layer plus a LoRA adapter split as NeMo splits it."""

        def __init__(self, base, split: str, dim: int, config, dropout: float):
            super().__init__()
            self.base, self.split = base, split
            self.sequence_parallel = config.sequence_parallel
            plain = dc.replace(config, sequence_parallel=False)  # adapters gather / scatter themselves
            tp = config.tensor_model_parallel_size
            if split == "column":
                in_f, out_f = base.input_size, base.output_size
                self.linear_in = ColumnParallelLinear(in_f, dim, config=plain, init_method=_init_noop, bias=False,
                                                      gather_output=True, disable_grad_reduce=self.sequence_parallel)
                self.linear_out = ColumnParallelLinear(dim, out_f, config=plain, init_method=_init_noop, bias=False,
                                                       gather_output=False)
            else:
                in_f, out_f = base.input_size, base.output_size
                self.linear_in = RowParallelLinear(in_f, dim, config=plain, init_method=_init_noop, bias=False,
                                                   input_is_parallel=True, skip_bias_add=True)
                self.linear_out = ColumnParallelLinear(dim, out_f, config=plain, init_method=_init_noop, bias=False,
                                                       gather_output=True)
            self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else None
            if dim % tp:
                raise UserError(f"method.lora_adapter_dim={dim} is not a multiple of tp={tp}",
                                "use an adapter dim divisible by parallelism.tp")

        def forward(self, x, *args, **kwargs):
            out, bias = self.base(x, *args, **kwargs)
            a = x
            if self.split == "column" and self.sequence_parallel:
                a = tensor_parallel.gather_from_sequence_parallel_region(a)
            if self.dropout is not None:
                a = self.dropout(a)
            a, _ = self.linear_in(a)
            a, _ = self.linear_out(a)
            if self.split == "row" and self.sequence_parallel:
                a = tensor_parallel.scatter_to_sequence_parallel_region(a)
            return out + a, bias

    class PromptEncoder(torch.nn.Module):
        """NeMo's PromptEncoderAdapter: virtual-token embedding -> column-parallel -> GELU -> row-parallel."""

        def __init__(self, virtual_tokens: int, bottleneck: int, embedding_dim: int, hidden: int, config):
            super().__init__()
            plain = dc.replace(config, sequence_parallel=False)
            self.virtual_tokens = virtual_tokens
            self.embedding = torch.nn.Embedding(virtual_tokens, embedding_dim, dtype=config.params_dtype)
            self.first = ColumnParallelLinear(embedding_dim, bottleneck, config=plain, init_method=_init_noop,
                                              bias=True, gather_output=False, skip_bias_add=True)
            self.second = RowParallelLinear(bottleneck, hidden, config=plain, init_method=_init_noop, bias=True,
                                            input_is_parallel=True, skip_bias_add=True)

        def forward(self, batch_size: int):
            idx = torch.arange(self.virtual_tokens, device=self.embedding.weight.device)
            h, b = self.first(self.embedding(idx).unsqueeze(1))  # [v, 1, bottleneck / tp]
            h = torch.nn.functional.gelu(h + b)
            out, b = self.second(h)
            return (out + b).expand(self.virtual_tokens, batch_size, -1)  # [v, b, hidden]

    _ADAPTERS.update(lora=LoraLinear, prompt=PromptEncoder)
    return LoraLinear, PromptEncoder


def _ptuning_wrapper():
    import torch
    from megatron.core import tensor_parallel

    class PTuningGPT(torch.nn.Module):
        """GPTModel + prompt encoder: on the first stage the placeholders' embeddings are replaced."""

        def __init__(self, gpt, encoder):
            super().__init__()
            self.gpt, self.prompt_encoder = gpt, encoder
            self.config, self.model_type = gpt.config, gpt.model_type

        def __getattr__(self, name):  # what the schedules ask of a model (pre_process, ...) is the GPT's
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self._modules["gpt"], name)

        def set_input_tensor(self, tensor):
            self.gpt.set_input_tensor(tensor)

        def forward(self, input_ids, position_ids, attention_mask, labels=None):
            if not self.gpt.pre_process:
                return self.gpt(input_ids, position_ids, attention_mask, labels=labels)
            sp = self.config.sequence_parallel
            emb = self.gpt.embedding.word_embeddings(input_ids)
            if sp:  # megatron returns it reduce-scattered over the sequence: [s / tp, b, h]
                emb = tensor_parallel.gather_from_sequence_parallel_region(emb, tensor_parallel_output_grad=False)
            else:  # [b, s, h]
                emb = emb.transpose(0, 1)
            v = self.prompt_encoder.virtual_tokens
            emb = torch.cat([self.prompt_encoder(input_ids.shape[0]).to(emb.dtype), emb[v:]], dim=0)
            if sp:
                emb = tensor_parallel.scatter_to_sequence_parallel_region(emb)
            return self.gpt(input_ids, position_ids, attention_mask, decoder_input=emb.contiguous(), labels=labels)

    return PTuningGPT


# ----------------------------------------------------------------------------- build
def build_chunks(recipe, layout: Layout, cuda: bool, load_base: Optional[Callable] = None) -> List:
    """This rank's model chunks (one per virtual stage), initialised, trainable parts set; ``load_base(chunk)``
    then replaces the seeded base weights (:func:`vdkit.recipes.megatron.base.loader`: base imports this module,
    so it is passed in, not imported)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from vdkit.planner.memory import padded_vocab  # the planner's padding: what memory.json compares against

    config = transformer_config(recipe, layout, cuda)
    vocab = padded_vocab(recipe.model.vocab_size, layout.tp)
    method = recipe.method
    chunks = []
    for vp_stage in range(layout.vp or 1):
        stage = vp_stage if layout.vp else None
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        gpt = GPTModel(config=config, transformer_layer_spec=layer_specs(config, stage), vocab_size=vocab,
                       max_sequence_length=recipe.model.max_position_embeddings, pre_process=pre, post_process=post,
                       share_embeddings_and_output_weights=recipe.model.tied_embeddings,
                       position_embedding_type="rope" if recipe.model.position_embedding == "rope" else "learned_absolute",
                       rotary_base=int(recipe.model.rope_base), vp_stage=stage, **rope_keys(recipe.model))
        model = gpt
        if method.name in ("lora", "ptuning"):
            for p in gpt.parameters():
                p.requires_grad_(False)
        if method.name == "lora":
            Lora, _ = _adapter_classes()
            for layer in gpt.decoder.layers:
                for parent in (layer.self_attention, layer.mlp):
                    for name in lora_targets.of(recipe):  # method.lora_targets
                        base = getattr(parent, name, None)
                        if base is not None:
                            setattr(parent, name, Lora(base, BASE_SPLIT[name], method.lora_adapter_dim, config,
                                                       method.lora_dropout))
        elif method.name == "ptuning" and pre:
            _, Encoder = _adapter_classes()
            encoder = Encoder(method.ptuning_virtual_tokens, method.ptuning_bottleneck_dim,
                              method.ptuning_embedding_dim, recipe.model.hidden_size, config)
            model = _ptuning_wrapper()(gpt, encoder)
        canonical_init(model, recipe.train.seed, recipe.model.num_layers, recipe.model.tied_embeddings)
        if load_base:  # the fine-tune's base (the adapters keep their initial values)
            load_base(model)
        if cuda:
            model = model.cuda(torch.cuda.current_device())
        chunks.append(model)
    return chunks


def global_name(local_name: str, layer_numbers: dict, tied: bool = False) -> str:
    """A parameter's name in the whole (unsplit) model: local layer index -> global layer number; a
    tied output layer (the last stage's copy) is the input embedding."""
    parts = local_name.split(".")
    for i in range(len(parts) - 2):
        if parts[i] == "decoder" and parts[i + 1] == "layers":
            parts[i + 2] = f"L{layer_numbers[int(parts[i + 2])]}"
    name = ".".join(p for p in parts if p not in ("gpt", "base"))
    return "embedding.word_embeddings.weight" if tied and name == "output_layer.weight" else name


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def canonical_init(model, seed: int, num_layers: int, tied: bool = False) -> None:
    """Set every parameter from (seed, global name): the same model on every layout.

    Norm weights 1, biases 0; linear and embedding weights N(0, 0.02), output projections of each
    layer (linear_proj, linear_fc2) N(0, 0.02 / sqrt(2 L)) as Megatron scales them; LoRA A xavier-normal
    and B 0 (NeMo's defaults); the prompt encoder N(0, 0.023), its embedding N(0, 1). Tensor-parallel
    parameters are drawn whole and split by megatron-core's ``_initialize_affine_weight_cpu``."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu

    gpt = getattr(model, "gpt", model)
    layer_numbers = {i: layer.layer_number for i, layer in enumerate(gpt.decoder.layers)}
    rank, world = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    out_std = INIT_STD / math.sqrt(2.0 * num_layers)
    for local, p in model.named_parameters():
        name = global_name(local, layer_numbers, tied)
        g = _generator(seed, name)
        leaf = local.rsplit(".", 1)[-1]
        if leaf == "bias" or ".linear_out." in local:
            fill = lambda w: w.zero_()  # noqa: E731
        elif "layernorm" in local or "final_norm" in local or local.endswith("norm.weight"):
            fill = lambda w: w.fill_(1.0)  # noqa: E731
        elif ".linear_in." in local:
            fill = lambda w, g=g: torch.nn.init.xavier_normal_(w, generator=g)  # noqa: E731
        elif "prompt_encoder.embedding" in local:
            fill = lambda w, g=g: w.normal_(0.0, 1.0, generator=g)  # noqa: E731
        else:
            std = (PTUNING_INIT_STD if "prompt_encoder" in local
                   else out_std if (".linear_proj." in local or ".linear_fc2." in local) else INIT_STD)
            fill = lambda w, g=g, std=std: w.normal_(0.0, std, generator=g)  # noqa: E731
        with torch.no_grad():
            if getattr(p, "tensor_model_parallel", False) and world > 1:
                dim, stride = p.partition_dim, getattr(p, "partition_stride", 1)
                full = list(p.shape)
                full[dim] *= world
                if p.dim() == 1:
                    master = torch.empty(full[0], dtype=torch.float32)
                    fill(master)
                    p.copy_(master.chunk(world)[rank].to(p.dtype))
                    continue
                _initialize_affine_weight_cpu(p, full[0], full[1], p.shape[dim], dim, fill, stride=stride,
                                              params_dtype=p.dtype, rank=rank, world_size=world,
                                              skip_set_tensor_parallel_attributes=True)
            else:
                master = torch.empty(p.shape, dtype=torch.float32)
                fill(master)
                p.copy_(master.to(p.dtype))

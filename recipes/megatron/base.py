"""The megatron engine's base weights: a fine-tune starts from the Hugging Face model at ``model.hf_path``.

The base is the staged HF directory the recipe names (the same one the reference engine's ``from_pretrained`` and
the conversion jobs read): ``config.json`` and safetensors (or ``pytorch_model*.bin``) files, read with
``safetensors`` / ``torch.load`` one tensor at a time, so a rank holds only its own pipeline stage's layers plus one
whole tensor. The names map HF Llama / Qwen2 (``LlamaForCausalLM``, ``Qwen2ForCausalLM``) onto megatron-core's
``GPTModel`` with the local layer spec (:data:`LAYER_MAP`); the tensor-parallel split is megatron-core's own
(``partition_dim`` on every sharded parameter): the fused QKV is laid out per query group (q heads, k, v), so
each TP rank's rows are whole groups; the gated MLP's ``linear_fc1`` holds [gate; up] of each rank's columns.
The vocabulary rows the kit pads (a multiple of 128 x TP, vdkit.planner.memory.padded_vocab) stay zero.

Which base (:func:`source`): none for pretraining; ``model.hf_path`` when it is a local directory; a fine-tune
with none trains the engine's seeded weights only where the recipe says so (:func:`refusal`, at the door).
Megatron-Bridge's AutoBridge holds the same mapping, but the megatron engine must not need Bridge
(tests/test_engine_coupling.py, and the engine's image is a plain NGC PyTorch with megatron-core).
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

from vdkit.errors import UserError
from vdkit.composition.schema import SEEDED_NOTE

KEY = "model.hf_path"  # the recipe key naming the base (one home; also the spec's base_model_key)
ARCHS = ("llama",)  # model.arch values whose HF layout this module maps (Llama, and Qwen2 = Llama + qkv_bias)
#: megatron-core layer parameter (after ``decoder.layers.N.``) -> HF parameter (after ``model.layers.N.``)
LAYER_MAP = {"input_layernorm.weight": "input_layernorm.weight",
             "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
             "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
             "mlp.linear_fc2.weight": "mlp.down_proj.weight"}
#: model fields config.json must agree with: ModelCfg field -> HF config key
CONFIG_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
               "ffn_hidden_size": "intermediate_size", "num_attention_heads": "num_attention_heads",
               "num_query_groups": "num_key_value_heads"}


def source(recipe) -> Optional[str]:
    """The HF directory this rank loads its base from, or None (pretraining, or no local base: seeded weights)."""
    hf = recipe.model.hf_path
    if recipe.method.name == "pretrain" or not hf or not str(hf).startswith("/"):
        return None
    return str(hf)


def seeded_note(recipe) -> Optional[str]:
    """Why a fine-tune trains seeded random weights (said in the plan, the render and the rank's first line), or None."""
    if recipe.method.name == "pretrain" or source(recipe):
        return None
    if not recipe.model.pretrained:
        return (f"{SEEDED_NOTE}model {recipe.model.name} has no pretrained weights (model.pretrained=false), so "
                f"{recipe.method.name} starts from the engine's seeded random weights")
    return (f"{SEEDED_NOTE}no local {KEY}, so this run.mode=timing {recipe.method.name} times the engine's seeded "
            "random weights (the step time is the same; the losses are not a fine-tune's)")


def describe(recipe) -> str:
    """The rank's words for its starting weights (its first line)."""
    path = source(recipe)
    return f"base weights from {path}" if path else (seeded_note(recipe) or "seeded weights (pretraining)")


def refusal(recipe) -> Optional[UserError]:
    """The door's rule: a fine-tune of a pretrained model (``model.pretrained``) in run.mode=train loads its base
    from a local ``model.hf_path``, a Llama-architecture HF directory. Timing runs and models without pretrained
    weights may train seeded weights (:func:`seeded_note` says so)."""
    r, m = recipe, recipe.model
    if r.method.name == "pretrain" or not m.pretrained or r.timing:
        return None
    if m.arch not in ARCHS:
        return UserError(f"engine=megatron {r.method.name} of model {m.name} (arch {m.arch}) would train random "
                         f"weights: it loads {'/'.join(ARCHS)}-architecture Hugging Face bases only",
                         "use engine=reference for this model, or run.mode=timing for a timing run")
    if not m.hf_path:
        return UserError(f"engine=megatron {r.method.name} fine-tunes a base, and {KEY} is not set: it would train "
                         "random weights", f"set {KEY}=/shared/models/<HF dir of {m.name}> (docs/cluster-guide.md), "
                         "or run.mode=timing for a timing run on seeded weights")
    if not str(m.hf_path).startswith("/"):
        return UserError(f"{KEY}={m.hf_path} is a hub id: engine=megatron loads its {r.method.name} base from a "
                         "staged directory", f"download it once on a login node (huggingface-cli download "
                         f"{m.hf_path} --local-dir /shared/models/...) and set {KEY} to that directory")
    return None


def check_rank(recipe, rank: bool = True) -> None:
    """A rank's guard before anything is built (also the local door and `vdkit check`, ``rank=False``): the base the
    plan names is a Hugging Face model directory (config.json and weights), its sizes the recipe's. UserError: one
    line, exit 2 (the recipe's fault); a rank's says no step was trained."""
    from vdkit.recipes.common import preflight

    path = source(recipe)
    if path is None:
        return
    why = preflight.problem(KEY, path, "hf")
    try:
        if why:
            raise UserError(why, preflight.FIXES["hf"])
        _check_config(recipe, path)
    except UserError as exc:
        raise UserError(exc.what + ("; no step trained" if rank else ""), exc.fix) from None


def _check_config(recipe, path: str) -> dict:
    m = recipe.model
    try:
        with open(os.path.join(path, "config.json")) as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as exc:
        raise UserError(f"{KEY}={path}: its config.json does not load ({type(exc).__name__})",
                        f"point {KEY} at the Hugging Face directory of {m.name}") from None
    kind = cfg.get("model_type")
    if kind not in ("llama", "qwen2"):
        raise UserError(f"{KEY}={path} is a {kind!r} model; engine=megatron maps Llama / Qwen2 bases",
                        f"point {KEY} at the Hugging Face directory of {m.name}")
    off = [f"{k} {cfg.get(h)} (model {m.name}: {getattr(m, k)})" for k, h in CONFIG_KEYS.items()
           if cfg.get(h, getattr(m, k) if h == "num_key_value_heads" else None) != getattr(m, k)]
    if off:
        raise UserError(f"{KEY}={path} is another model: {', '.join(off)}",
                        f"point {KEY} at the Hugging Face directory of {m.name}, or pick the model it holds")
    return cfg


class _Reader:
    """One tensor at a time from the directory's safetensors (sharded or not) or PyTorch .bin files."""

    def __init__(self, path: str):
        names = sorted(os.listdir(path))
        self.path, self.where, self._open = path, {}, {}
        files = [n for n in names if n.endswith(".safetensors")] or [n for n in names if n.endswith(".bin")]
        for name in files:
            for key in self._file(name).keys():
                self.where[key] = name

    def _file(self, name):
        if name not in self._open:
            full = os.path.join(self.path, name)
            if name.endswith(".safetensors"):
                from safetensors import safe_open

                self._open[name] = safe_open(full, framework="pt")
            else:
                import torch

                self._open[name] = torch.load(full, map_location="cpu", mmap=True, weights_only=True)
        return self._open[name]

    def get(self, key: str):
        if key not in self.where:
            raise UserError(f"{KEY}={self.path} holds no tensor {key}; no step trained",
                            "point it at a complete Hugging Face Llama / Qwen2 checkpoint")
        f = self._file(self.where[key])
        return f.get_tensor(key) if hasattr(f, "get_tensor") else f[key]


def _whole(name: str, hf: _Reader, m, tp: int, vocab: int):
    """The whole megatron-core tensor ``name`` (a global name, layers as ``L<number>``), laid out so that megatron-core's
    split along the parameter's ``partition_dim`` into ``tp`` chunks gives each rank its shard."""
    import torch

    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        w = hf.get("model.embed_tokens.weight" if name.startswith("embedding") or m.tied_embeddings else "lm_head.weight")
        return torch.cat([w, w.new_zeros(vocab - w.shape[0], w.shape[1])]) if vocab > w.shape[0] else w
    if name == "decoder.final_layernorm.weight":
        return hf.get("model.norm.weight")
    parts = name.split(".")
    layer, rest = int(parts[2][1:]) - 1, ".".join(parts[3:])  # megatron-core numbers layers from 1
    pre = f"model.layers.{layer}."
    if rest in LAYER_MAP:
        return hf.get(pre + LAYER_MAP[rest])
    if rest == "mlp.linear_fc1.weight":  # each TP rank holds [gate; up] of its own columns
        gate, up = hf.get(pre + "mlp.gate_proj.weight"), hf.get(pre + "mlp.up_proj.weight")
        return torch.cat([torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))])
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        leaf = rest.rsplit(".", 1)[1]
        q, k, v = (hf.get(f"{pre}self_attn.{p}_proj.{leaf}") for p in "qkv")
        groups, d = m.num_query_groups, m.hidden_size // m.num_attention_heads
        per = m.num_attention_heads // groups
        q, k, v = (t.reshape(groups, n * d, *t.shape[1:]) for t, n in ((q, per), (k, 1), (v, 1)))
        return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])  # per group: its q heads, then k, then v
    raise UserError(f"engine=megatron has no Hugging Face name for {name}", "use engine=reference for this model")


def loader(recipe) -> Optional[Callable]:
    """``build_chunks``' ``load_base``: a function loading the recipe's base into one chunk, or None (seeded weights)."""
    path = source(recipe)
    return (lambda model: load(model, recipe, path)) if path else None


def load(model, recipe, path: str) -> int:
    """Overwrite the base parameters of one model chunk (this rank's shard of each) with the HF model at ``path``;
    adapters (LoRA, the prompt encoder) keep their initial values. Returns the number of tensors loaded."""
    import torch
    from megatron.core import parallel_state as ps

    from vdkit.planner.memory import padded_vocab
    from vdkit.recipes.megatron.model import global_name

    _check_config(recipe, path)
    m, hf = recipe.model, _Reader(path)
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    vocab = padded_vocab(m.vocab_size, tp)
    gpt = getattr(model, "gpt", model)
    layer_numbers = {i: layer.layer_number for i, layer in enumerate(gpt.decoder.layers)}
    n = 0
    for local, p in model.named_parameters():
        if "prompt_encoder" in local or ".linear_in." in local or ".linear_out." in local:
            continue  # the method's own parameters
        name = global_name(local, layer_numbers, m.tied_embeddings)
        whole = _whole(name, hf, m, tp, vocab)
        if getattr(p, "tensor_model_parallel", False) and tp > 1:
            whole = whole.chunk(tp, dim=p.partition_dim)[rank]
        if tuple(whole.shape) != tuple(p.shape):
            raise UserError(f"{KEY}={path}: {name} has shape {tuple(whole.shape)} for this rank, the model "
                            f"{tuple(p.shape)}; no step trained", f"point {KEY} at the Hugging Face directory of {m.name}")
        with torch.no_grad():
            p.copy_(whole.to(p.dtype))
        n += 1
    return n

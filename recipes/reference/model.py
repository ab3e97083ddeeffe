"""The model from ModelCfg through transformers' own classes (LlamaForCausalLM, OPTForCausalLM; random
init from ``train.seed``), or pretrained weights from ``model.hf_path``, with the method's peft wrapper.

- sft / pretrain: every weight trains;
- lora: peft LoRA on the attention projections q/k/v (NeMo 1.23 puts LoRA on the fused QKV),
  r = method.lora_adapter_dim, alpha = r (scale 1, NeMo's default), dropout method.lora_dropout;
- ptuning: peft's PromptEncoder (MLP reparameterization), method.ptuning_virtual_tokens virtual
  tokens, encoder hidden size method.ptuning_bottleneck_dim; the base model is frozen.
"""
from __future__ import annotations

from vdkit.errors import UserError


def llama_config(model_cfg, tok, attention: str = "sdpa"):
    """A transformers LlamaConfig from ModelCfg's sizes and architecture fields, with the tokenizer's ids; a
    Qwen2Config for ``qkv_bias`` (Qwen2: the Llama block with biases on q, k and v only, none on o)."""
    from transformers import LlamaConfig, Qwen2Config

    m = model_cfg
    if (m.arch, m.norm, m.activation, m.position_embedding, m.bias) != ("llama", "rmsnorm", "swiglu", "rope", False):
        raise UserError(f"the reference engine builds Llama-architecture models; model {m.name} is arch={m.arch} "
                        f"norm={m.norm} activation={m.activation} position_embedding={m.position_embedding} "
                        f"bias={m.bias}", "use a Llama model (model=tiny_llama, llama2_7b, ...)")
    return (Qwen2Config if m.qkv_bias else LlamaConfig)(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups, max_position_embeddings=m.max_position_embeddings,
        rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tied_embeddings, rope_theta=m.rope_base,
        rope_scaling=dict(m.rope_scaling) if m.rope_scaling else None,
        pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, use_cache=False,
        attn_implementation=attention)


def opt_config(model_cfg, tok, attention: str = "sdpa"):
    """A transformers OPTConfig from ModelCfg (learned positions, LayerNorm, ReLU / GeLU MLP, biases, tied).

    Dropout is off: random-init models here are for comparing strategies step for step (a
    pretrained ``model.hf_path`` keeps its own config, dropout included, as the HF Trainer does).
    """
    from transformers import OPTConfig

    m = model_cfg
    if m.norm != "layernorm" or m.position_embedding != "learned" or m.activation not in ("relu", "gelu") \
            or m.num_query_groups != m.num_attention_heads:
        raise UserError(f"model {m.name}: arch=opt needs norm=layernorm, position_embedding=learned, activation "
                        f"relu or gelu and no grouped-query attention (got {m.norm}, {m.position_embedding}, "
                        f"{m.activation}, {m.num_query_groups} of {m.num_attention_heads} heads)",
                        "fix the model's architecture fields or use arch=llama")
    if m.norm_eps != 1e-5:
        raise UserError(f"model {m.name}: OPT's LayerNorm epsilon is fixed at 1e-5 in transformers, not {m.norm_eps}",
                        "set model.norm_eps=1e-5")
    return OPTConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, ffn_dim=m.ffn_hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, max_position_embeddings=m.max_position_embeddings,
        word_embed_proj_dim=m.embedding_dim or m.hidden_size, do_layer_norm_before=m.pre_norm, enable_bias=m.bias,
        activation_function=m.activation, tie_word_embeddings=m.tied_embeddings, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, use_cache=False,
        attn_implementation=attention)


def _pretrained(recipe, fabric):
    """``model.hf_path`` through transformers' from_pretrained, checked against the recipe's sizes.

    Under ZeRO-3 transformers' HfDeepSpeedConfig is alive while loading, so every rank loads only
    its partitions (zero.Init) instead of the whole model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    m = recipe.model
    keep = fabric.hf_config() if hasattr(fabric, "hf_config") else None  # noqa: F841 (must outlive loading)
    dtype = torch.bfloat16 if keep is not None and fabric.config["bf16"]["enabled"] else torch.float32
    model, info = AutoModelForCausalLM.from_pretrained(m.hf_path, dtype=dtype, attn_implementation=recipe.engine.attention,
                                                       output_loading_info=True)
    # transformers initialises every weight its files lack at random and only logs it ("newly initialized"): a base
    # saved with prefixed names (module., base_model.model.) or half a conversion would fine-tune random weights
    missing = sorted(set(info.get("missing_keys") or ()))
    if missing:
        raise UserError(f"model.hf_path={m.hf_path} lacks {len(missing)} of the model's weights (e.g. {missing[0]}; "
                        f"its files hold {len(info.get('unexpected_keys') or ())} names the model does not have): "
                        "transformers would start them from random values; no step trained",
                        "point model.hf_path at a complete Hugging Face checkpoint of the model (save_pretrained's "
                        "names, no module. / base_model.model. prefixes)")
    cfg = model.config
    got = (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers)
    if got != (m.vocab_size, m.hidden_size, m.num_layers):
        raise UserError(f"model.hf_path={m.hf_path} has vocabulary, hidden size and layers {got}, model {m.name} "
                        f"says {(m.vocab_size, m.hidden_size, m.num_layers)}",
                        "point model.hf_path at the checkpoint of the configured model")
    model.config.use_cache = False
    return model


def build_model(recipe, tok, fabric=None):
    """The model to train (a peft model for lora / ptuning).

    ``model.hf_path`` set: the pretrained weights (transformers' own loader); otherwise
    transformers' own class for ``model.arch`` (LlamaForCausalLM or, with ``qkv_bias``, Qwen2ForCausalLM;
    OPTForCausalLM) initialised from
    ``train.seed``. ``parallelism.recompute=full`` turns on transformers' gradient checkpointing.
    """
    import torch
    from transformers import AutoModelForCausalLM, OPTForCausalLM

    torch.manual_seed(recipe.train.seed)  # every rank builds the same initial weights
    if recipe.model.hf_path:
        model = _pretrained(recipe, fabric)
    elif recipe.model.arch == "opt":
        model = OPTForCausalLM(opt_config(recipe.model, tok, recipe.engine.attention))
    else:
        model = AutoModelForCausalLM.from_config(llama_config(recipe.model, tok, recipe.engine.attention))
    if recipe.parallelism.recompute == "full":
        enable_recompute(model)
    return wrap_method(model, recipe)


def enable_recompute(model) -> None:
    """Full activation recompute through transformers' own switch: ``activation_checkpointing_enable`` where the
    installed transformers has it (5.x, whose old name ``gradient_checkpointing_enable`` warns that v6 removes it),
    the old name on the releases before it."""
    kwargs = {"use_reentrant": False}  # torch's non-reentrant checkpoint: works with frozen inputs (peft)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def wrap_method(model, recipe):
    """``model`` wrapped for the recipe's method with peft (lora: LoraConfig on ``method.lora_targets``' transformers
    modules, vdkit.planner.lora_targets.hf_modules; ptuning:
    PromptEncoderConfig), or ``model`` itself; raises what peft raises (a target that names no module of the model
    is peft's ValueError: `vdkit check` runs this on the staged model's config)."""
    method = recipe.method
    if recipe.is_peft:
        from vdkit.recipes.common.known_warnings import silence

        silence("peft")  # peft reads a property transformers 5 deprecates
    if method.name == "lora":
        from peft import LoraConfig, get_peft_model

        from vdkit.planner.lora_targets import hf_modules

        cfg = LoraConfig(task_type="CAUSAL_LM", r=method.lora_adapter_dim, lora_alpha=method.lora_adapter_dim,
                         lora_dropout=method.lora_dropout, target_modules=list(hf_modules(recipe)))
        model = get_peft_model(model, cfg)
    elif method.name == "ptuning":
        from peft import PromptEncoderConfig, get_peft_model

        cfg = PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=method.ptuning_virtual_tokens,
                                  encoder_hidden_size=method.ptuning_bottleneck_dim,
                                  encoder_reparameterization_type="MLP")
        model = get_peft_model(model, cfg)
    return model


def trainable_state(model) -> dict:
    """The trainable parameters by name (what a checkpoint must hold to resume)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model, state: dict) -> None:
    """Restore :func:`trainable_state`; every trainable parameter must be present."""
    import torch

    params = dict(model.named_parameters())
    wanted = {n for n, p in params.items() if p.requires_grad}
    if set(state) != wanted:
        missing = sorted(wanted - set(state))[:3]
        raise UserError(f"checkpoint does not match the model (missing {missing or 'none'}, "
                        f"{len(set(state) - wanted)} unexpected)",
                        "resume with the recipe that wrote the checkpoint, or move the checkpoints away")
    with torch.no_grad():
        for n, v in state.items():
            params[n].copy_(v.to(params[n].device))

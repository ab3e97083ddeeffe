"""The Llama architecture built from ModelCfg (no weights download), with the method's peft wrapper.

- sft / pretrain: every weight trains;
- lora: peft LoRA on the attention projections q/k/v (NeMo 1.23 puts LoRA on the fused QKV),
  r = method.lora_adapter_dim, alpha = r (scale 1, NeMo's default), dropout method.lora_dropout;
- ptuning: peft's PromptEncoder (MLP reparameterization), method.ptuning_virtual_tokens virtual
  tokens, encoder hidden size method.ptuning_bottleneck_dim; the base model is frozen.
"""
from __future__ import annotations

from vdkit.errors import UserError


def llama_config(model_cfg, tok):
    """A transformers LlamaConfig from ModelCfg's sizes and architecture fields, with the tokenizer's ids."""
    from transformers import LlamaConfig

    m = model_cfg
    if (m.arch, m.norm, m.activation, m.position_embedding, m.bias) != ("llama", "rmsnorm", "swiglu", "rope", False):
        raise UserError(f"the reference engine builds Llama-architecture models; model {m.name} is arch={m.arch} "
                        f"norm={m.norm} activation={m.activation} position_embedding={m.position_embedding} "
                        f"bias={m.bias}", "use a Llama model (model=tiny_llama, llama2_7b, ...)")
    return LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups, max_position_embeddings=m.max_position_embeddings,
        rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tied_embeddings, rope_theta=m.rope_base,
        rope_scaling=dict(m.rope_scaling) if m.rope_scaling else None,
        pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, use_cache=False)


def build_model(recipe, tok):
    """The model to train (a peft model for lora / ptuning), initialised from ``train.seed``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe.train.seed)  # every rank builds the same initial weights
    model = LlamaForCausalLM(llama_config(recipe.model, tok))
    method = recipe.method
    if method.name == "lora":
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(task_type="CAUSAL_LM", r=method.lora_adapter_dim, lora_alpha=method.lora_adapter_dim,
                         lora_dropout=method.lora_dropout, target_modules=["q_proj", "k_proj", "v_proj"])
        model = get_peft_model(model, cfg)
    elif method.name == "ptuning":
        from peft import PromptEncoderConfig, get_peft_model

        cfg = PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=method.ptuning_virtual_tokens,
                                  encoder_hidden_size=method.ptuning_bottleneck_dim,
                                  encoder_reparameterization_type="MLP")
        model = get_peft_model(model, cfg)
    return model


def virtual_tokens(recipe) -> int:
    """Positions the prompt encoder adds in front of every sample (0 unless ptuning)."""
    return recipe.method.ptuning_virtual_tokens if recipe.method.name == "ptuning" else 0


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

"""recipe=fast on NeMo 1.23: NVIDIA's fine-tuning performance settings, and where the kit departs from them.

The NeMo config (:mod:`vdkit.recipes.nemo.config`) renders these for fine-tuning with ``train.fused_kernels``
(the fast recipe); docs/fast-recipe.md prints :data:`PERFORMANCE_DEPARTURES`.
"""
from __future__ import annotations

# recipe=fast renders NVIDIA's fine-tuning performance settings (NeMo-Framework-Launcher's H100 PEFT / SFT
# examples, e.g. 70B LoRA on 2 nodes: megatron_amp_O2 True, a distributed optimizer, precision bf16),
# because the step-time model predicts the fast recipe at the efficiency of NVIDIA's published runs
# (vdkit.planner.predict: the fused path). tests/test_fast_recipe.py ties the rendered settings to that prediction.
# The launcher's later examples name mcore_distributed_optim, which NeMo 1.23 (the 24.01 image) does not
# register (nemo/core/optim/optimizers.py: first in 2.0.0rc0); 1.23's is Apex's distributed_fused_adam.
PERFORMANCE_SETTINGS = {"model.megatron_amp_O2": True, "trainer.precision": "bf16",
                        "model.optim.name": "distributed_fused_adam"}
# Where recipe=fast departs from NVIDIA's settings, and why (docs/fast-recipe.md prints this list).
PERFORMANCE_DEPARTURES = {
    "model.optim.name": "distributed_fused_adam (Apex's, what NeMo 1.23 registers) for the launcher's "
                        "mcore_distributed_optim (NeMo 2.0 onwards); fused_adam when parallelism.distributed_optimizer="
                        "false (the user's choice: the plan's memory then counts unsharded optimizer states, and the "
                        "contract check keeps the two equal)",
    "model.data.train_ds.file_names": "the packed .npy `vdkit data pack` writes (NeMo 1.23 ships no packing script; "
                                      "GPTSFTPackedDataset np.loads the file): data.packed_file's path",
    "model.ub_tp_comm_overlap": "not rendered: it needs --mpi=pmix and a userbuffers-enabled Transformer Engine "
                                "build; the step-time model does not count it either",
    "model.gradient_accumulation_fusion": "full-parameter SFT only: LoRA / P-tuning train no base weights, so there "
                                          "is no weight-gradient accumulation to fuse; and only where NeMo 1.23 keeps "
                                          "it (megatron_base_model.py: megatron_amp_O2, and DP 1, PP > 1 or "
                                          "distributed_fused_adam), else NeMo would turn it off in silence",
}


def renders_performance_settings(recipe) -> bool:
    """Whether a fine-tuning recipe renders NVIDIA's performance settings (the fast recipe's fused kernels)."""
    return recipe.method.name != "pretrain" and bool(recipe.train.fused_kernels)


def megatron_amp_o2(recipe) -> bool:
    """model.megatron_amp_O2 as the NeMo config renders it: on for full-parameter training (Dell's SFT runs,
    pretraining) and for every method in the fast recipe (NVIDIA's performance settings); off for LoRA / P-tuning
    in the design guide's recipe, NeMo 1.23's own PEFT default (megatron_gpt_finetuning_config.yaml). Without it
    NeMo keeps fp32 parameters (megatron_base_model.py:128-132), which the memory model counts (the engine
    spec's ``fp32_params``)."""
    return renders_performance_settings(recipe) or not recipe.is_peft



def optimizer_name(plan) -> str:
    """method.optimizer; the fast recipe's NVIDIA optimizer (distributed Adam; fused_adam without the
    distributed optimizer, the user's choice)."""
    if renders_performance_settings(plan.recipe):
        return PERFORMANCE_SETTINGS["model.optim.name"] if plan.recipe.parallelism.distributed_optimizer else "fused_adam"
    return plan.recipe.method.optimizer


def fast_kernels(plan) -> dict:
    """The fast recipe's fused kernels for fine-tuning (train.fused_kernels); NeMo's defaults otherwise.

    Gradient-accumulation fusion needs O2's fp32 main gradients, so full-parameter SFT only."""
    r = plan.recipe
    if not r.train.fused_kernels:
        return {}
    out = {"bias_activation_fusion": True, "bias_dropout_add_fusion": True, "masked_softmax_fusion": True,
           "use_flash_attention": True}
    if not r.is_peft and grad_accumulation_fusion_kept(plan, optimizer_name(plan)):
        out["gradient_accumulation_fusion"] = True
    return out


def grad_accumulation_fusion_kept(plan, optimizer: str) -> bool:
    """Whether NeMo 1.23 keeps gradient_accumulation_fusion (megatron_base_model.py, _validate_and_override_config):
    with DP > 1 and PP 1 only under distributed_fused_adam; with megatron_amp_O2 always (the fast recipe's)."""
    return plan.dp == 1 or plan.pp > 1 or optimizer == "distributed_fused_adam"

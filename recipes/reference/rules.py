"""The reference engine's start-up rules, decided from the plan alone: what its ranks would refuse (the rank,
the engine's door check and `vdkit check`'s probe all call :func:`check_plan`)."""
from __future__ import annotations

from vdkit.errors import UserError

MIN_ROOM = 4  # tokens a sample needs next to the virtual tokens (prompt, answer, EOS)


def check_plan(plan) -> None:
    """What the ranks would refuse, decided from the plan alone (see :func:`check`)."""
    from vdkit.recipes.common.data import virtual_tokens

    if plan.tp * plan.pp != 1:  # the layout rule first: it needs nothing but the layout
        from vdkit.planner.layout import layout_violations

        r = plan.recipe
        pure_dp = layout_violations(r, 1, 1, 1)  # why the planner had to leave plain data parallelism, if it had to
        why = f": with TP 1 x PP 1 on {r.world_size} GPUs, no valid layout: {pure_dp[0]}" if pure_dp else ""
        raise UserError(f"engine={r.engine.name} runs data parallel only; the plan uses tp={plan.tp} pp={plan.pp}{why}",
                        ("change train.global_batch_size (a multiple of micro batch x GPUs) or the GPUs" if pure_dp
                         else "pin parallelism.tp=1 parallelism.pp=1") + ", or use an engine with model parallelism")
    r = plan.recipe
    if r.method.name == "lora" and r.engine.lora_qkv != "separate":  # the planner counts what is trained
        raise UserError(f"the reference engine puts LoRA on q, k and v separately (peft); engine.lora_qkv="
                        f"{r.engine.lora_qkv} would plan another parameter count", "set engine.lora_qkv=separate")
    t = plan.recipe.train
    if plan.grad_accum * plan.dp * t.micro_batch_size != t.global_batch_size:
        raise UserError(f"train.global_batch_size={t.global_batch_size} is not a multiple of MBS x DP "
                        f"= {t.micro_batch_size * plan.dp}", "adjust train.global_batch_size")
    room = t.seq_length - virtual_tokens(plan.recipe)
    if room < MIN_ROOM:
        extra = f" next to {virtual_tokens(plan.recipe)} virtual tokens" if virtual_tokens(plan.recipe) else ""
        raise UserError(f"train.seq_length={t.seq_length} leaves {max(room, 0)} token(s) per sample{extra}; "
                        f"the reference engine needs at least {MIN_ROOM}",
                        "raise train.seq_length (e.g. train.seq_length=128)"
                        + (" or lower method.ptuning_virtual_tokens" if extra else ""))

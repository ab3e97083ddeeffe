"""HF weights -> a Megatron-Bridge checkpoint, once per model: what ``model.megatron_path`` points at.

On the cluster, inside the NeMo container, this is Bridge's own one-liner,
``AutoBridge.import_ckpt(HF_DIR, OUT_DIR)`` (``models/conversion/auto_bridge.py:688``): the run dir's
``import_hf.sbatch`` runs it on one node. It writes ``OUT_DIR/iter_0000000`` (torch_dist weights,
the tokenizer, ``run_config.yaml``); every fine-tuning run then loads it as
``checkpoint.pretrained_checkpoint`` and Bridge reshards it to the run's TP / PP.

Here (no CUDA) ``python -m vdkit.recipes.bridge.convert HF_DIR OUT_DIR`` does the same conversion
the way it works on a CPU (import_ckpt as shipped forces ``apply_rope_fusion`` in
``llama_bridge.py:66-70`` and an NCCL process group in ``model_provider.py:170``): the pinned shim,
a gloo process group, ``to_megatron_provider(load_weights=True)`` with fusions off and the local
layer spec, ``provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)``,
``save_megatron_model``.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path, PurePosixPath

from vdkit.errors import UserError
from vdkit.recipes.bridge.base import base_checkpoint, chains_import, default_base  # noqa: F401 (used here; tests)

IMPORT_PY = ("from megatron.bridge import AutoBridge; import sys; "
             "AutoBridge.import_ckpt(sys.argv[1], sys.argv[2])")
# The way back (auto_bridge.py export_ckpt: load the Megatron checkpoint, save_hf_pretrained with the
# adapters merged): a run.mode=train run's final weights in the HF format vLLM / transformers serve.
EXPORT_PY = ("from megatron.bridge import AutoBridge; import sys; "
             "AutoBridge.from_hf_pretrained(sys.argv[1]).export_ckpt(sys.argv[2], sys.argv[3])")


def import_sbatch(plan, run_dir, chained: bool = False) -> str:
    """The one-time conversion job (one whole node, one task, in the run's container), as sbatch text;
    ``chained``: the run's training job waits on it (`vdkit submit` submits both)."""
    from vdkit.recipes.common import staging

    r = plan.recipe
    out = r.model.megatron_path or default_base(r)
    src = staging.conversion_source(r)
    how = ("`vdkit submit` (or the line `vdkit render` prints) submits it first and training after it "
           "(--dependency=afterok)" if chained else "Run it once per site and model (not per job):   sbatch import_hf.sbatch")
    comments = [
        f"One-time step before fine-tuning {r.model.name} with engine=bridge: convert the staged HF weights",
        f"({src}) to a Megatron-Bridge checkpoint with Bridge's own AutoBridge.import_ckpt, in the same container.",
        how,
        f"It writes {out}/iter_0000000 (and its tokenizer); launch.sbatch loads it as checkpoint.pretrained_checkpoint",
        "(model.megatron_path) and Bridge reshards it to the run's TP / PP. The whole node: the import builds the",
        "model in host memory (use_cpu_initialization; a 70B holds ~140 GB).",
    ]
    mounts = {staging.parent(out)} | ({src} if staging.is_local(src) else set())
    return staging.one_node_sbatch(plan, f"import-{r.model.name}", comments, r.engine.container_image or "",
                                   mounts, ["python", "-c", IMPORT_PY, src, out],
                                   secrets=not staging.is_local(src)).replace(
        "set -euo pipefail\n", f"set -euo pipefail\nmkdir -p {shlex.quote(staging.parent(out))}\n", 1)


def export_sbatch(plan, run_dir, ckpt_dir) -> str:
    """run.mode=train: the job that turns the run's last checkpoint into HF weights (``ckpt_dir``/hf),
    as sbatch text (one whole node, one task, the run's container). It exports only once the run has
    finished: a run longer than one allocation hands over (its first job ends 0, so ``afterok`` of it would
    start the export mid-run), so until the run's ``finished`` file exists the job queues itself again after
    the run's latest job (:func:`wait_for_the_run_lines`) and exits."""
    from vdkit.recipes.common import staging

    r = plan.recipe
    src = staging.conversion_source(r)  # the HF config (architecture) export_ckpt writes the weights into
    out = str(PurePosixPath(ckpt_dir) / "hf")
    comments = [
        f"After the run: export its last checkpoint ({ckpt_dir}) to Hugging Face weights in {out}",
        "with Bridge's own AutoBridge.export_ckpt (LoRA adapters merged into the base), inside the same container.",
        "  sbatch --dependency=afterany:<any job of the run> export_hf.sbatch   (or at once: sbatch export_hf.sbatch)",
        "It exports only after the run's last allocation: until the run dir's file `finished` exists it queues",
        "itself again after the run's latest job (job_id.txt) and exits.",
    ]
    mounts = {str(PurePosixPath(ckpt_dir))} | ({src} if staging.is_local(src) else set())
    text = staging.one_node_sbatch(plan, f"export-{r.run_name}", comments, r.engine.container_image or "", mounts,
                                   ["python", "-c", EXPORT_PY, src, str(ckpt_dir), out], time="02:00:00",
                                   secrets=not staging.is_local(src))
    return text.replace("set -euo pipefail\n", "set -euo pipefail\n" + "\n".join(wait_for_the_run_lines(run_dir))
                        + "\n", 1)


def wait_for_the_run_lines(run_dir) -> list:
    """Batch-shell lines: continue only when the run has finished; else queue this script again after the run's
    latest job while one is queued or running, or stop (exit 1) saying the run ended unfinished."""
    from vdkit.run.rundir import BRIDGE_EXPORT_FILE, FINISHED_FILE, JOB_ID_FILE

    q = shlex.quote
    run = str(run_dir)
    return [
        "# Only after the run's last allocation (a job that hands over ends 0 too: afterok of it is mid-run)",
        f"if [ ! -e {q(run + '/' + FINISHED_FILE)} ]; then",
        f"  LAST=$(tail -n 1 {q(run + '/' + JOB_ID_FILE)} 2>/dev/null || true)",
        '  if [ -n "$LAST" ] && squeue -h -j "$LAST" -o %i 2>/dev/null | grep -qx "$LAST"; then',
        f'    sbatch --dependency=afterany:"$LAST" {q(run + "/" + BRIDGE_EXPORT_FILE)}',
        '    echo "vdkit: the run has not finished; the export waits for its job $LAST"',
        "    exit 0",
        "  fi",
        f'  echo "vdkit: the run has not finished (its run dir has no {FINISHED_FILE}) and none of its jobs is queued: '
        'nothing to export; continue the run (vdkit status RUN_DIR), then submit this again" >&2',
        "  exit 1",
        "fi",
    ]


def convert_on_cpu(hf_dir: str, out_dir: str) -> None:
    """Bridge's HF import on this CPU (see the module docstring)."""
    from vdkit.recipes.bridge import cpu_shim

    cpu_shim.apply()
    import torch
    from megatron.bridge import AutoBridge

    from vdkit.recipes.bridge.config import FUSIONS
    from vdkit.recipes.common.mcore_cpu import local_block_spec

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    bridge = AutoBridge.from_hf_pretrained(hf_dir, torch_dtype=torch.float32)
    provider = bridge.to_megatron_provider(load_weights=True)
    for k in FUSIONS:
        setattr(provider, k, False)
    provider.transformer_layer_spec = local_block_spec
    provider.bf16, provider.params_dtype = False, torch.float32
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    bridge.save_megatron_model(model, out_dir, hf_tokenizer_path=hf_dir)
    torch.distributed.destroy_process_group()


def toy_hf_checkpoint(model, out_dir, seed: int) -> Path:
    """A seeded, randomly initialised HF Llama with ``model``'s sizes (a ModelCfg), saved to ``out_dir`` with
    the kit's byte-level tokenizer: the stand-in for a site's HF weights on a CPU (tests, the demo)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=model.vocab_size, hidden_size=model.hidden_size,
                      intermediate_size=model.ffn_hidden_size, num_hidden_layers=model.num_layers,
                      num_attention_heads=model.num_attention_heads, num_key_value_heads=model.num_query_groups,
                      rms_norm_eps=model.norm_eps, rope_theta=model.rope_base,
                      max_position_embeddings=model.max_position_embeddings,
                      tie_word_embeddings=bool(model.tied_embeddings), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    out = Path(out_dir)
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    for name, text in byte_tokenizer_files(".").items():
        (out / name).write_text(text)
    return out


def make_base(recipe, root) -> Path:
    """``root/base``: a Bridge checkpoint of a seeded toy HF model with the recipe's sizes, converted by
    :func:`main` in a child process (the CPU shim changes the process it runs in). Made once."""
    import subprocess

    root = Path(root)
    base = root / "base"
    if (base / "iter_0000000").is_dir():
        return base
    hf = toy_hf_checkpoint(recipe.model, root / "hf", recipe.train.seed)
    done = subprocess.run([sys.executable, "-m", "vdkit.recipes.bridge.convert", str(hf), str(base)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"converting {hf} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return base


def main(argv=None) -> int:
    """``python -m vdkit.recipes.bridge.convert HF_DIR OUT_DIR``: GPU: AutoBridge.import_ckpt; CPU: the same steps."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m vdkit.recipes.bridge.convert HF_DIR OUT_DIR", file=sys.stderr)
        return 2
    hf_dir, out_dir = args
    try:
        if not os.path.isdir(hf_dir):
            raise UserError(f"{hf_dir} is not a directory", "pass a local Hugging Face checkpoint directory")
        if os.path.exists(os.path.join(out_dir, "iter_0000000")):
            raise UserError(f"{out_dir} already holds a converted checkpoint", "choose a new OUT_DIR")
        import torch

        if torch.cuda.is_available():
            from megatron.bridge import AutoBridge

            AutoBridge.import_ckpt(hf_dir, out_dir)
        else:
            convert_on_cpu(hf_dir, out_dir)
    except UserError as exc:
        print(f"vdkit: error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {hf_dir} -> {out_dir} (model.megatron_path={out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

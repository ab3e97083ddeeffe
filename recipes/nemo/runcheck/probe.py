"""NeMo 1.23's own code on a rendered ``nemo.yaml``, as far as a CPU goes: run in the NeMo 1.23 venv.

    python probe.py < cells.json      (a JSON list, one object per run directory; see vdkit.recipes.nemo.runcheck)

Prints one JSON object per finding: ``{"run_dir", "kind", "text"}`` (kinds: checked, not checked here,
defect). Standard library + NeMo (its omegaconf, numpy, torch); imports nothing of vdkit. Per run dir:

1. optimizer and scheduler by name through NeMo's registries (``nemo/core/optim/optimizers.py``
   ``get_optimizer``, ``parse_optimizer_args``; ``lr_scheduler.py`` ``get_scheduler``);
2. fine-tuning: the config merge ``megatron_gpt_finetuning.py`` performs on restore
   (``NLPAdapterModelMixin.merge_cfg_with``, executed from its source) on the base model's config:
   the ``.nemo``'s own where it is here, else the plan's model dimensions (said so);
3. fine-tuning: the dataset NeMo builds (``MegatronGPTSFTModel._build_dataset``, executed from its
   source: the class the config selects, GPTSFTPackedDataset's ``np.load`` included) and its first item,
   where the files are here; a stand-in byte-level tokenizer where the .nemo's is not.
"""
import ast
import inspect
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim  # noqa: E402

shim.apply()

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict  # noqa: E402

OUT = sys.stdout


def say(run_dir, kind, text):
    OUT.write(json.dumps({"run_dir": run_dir, "kind": kind, "text": " ".join(str(text).split())}) + "\n")
    OUT.flush()


def one_line(exc, limit=300):
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = f"{type(exc).__name__}: {msg}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def from_source(module, qualname, namespace):
    """A function of ``module`` compiled from its own source text (the module itself is not imported:
    its other imports need Apex / megatron-core 0.5), with ``namespace`` as its globals."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    with open(spec.origin) as fh:
        tree = ast.parse(fh.read(), spec.origin)
    cls_name, _, fn_name = qualname.rpartition(".")
    for node in tree.body if not cls_name else ():
        if isinstance(node, ast.FunctionDef) and node.name == fn_name:
            node.decorator_list = []
            ns = dict(namespace)
            exec(compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec"), ns)
            return ns[fn_name], f"{spec.origin.split('site-packages/')[-1]}:{node.lineno}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn_name:
                    item.decorator_list = []
                    code = compile(ast.Module(body=[item], type_ignores=[]), spec.origin, "exec")
                    ns = dict(namespace)
                    exec(code, ns)
                    return ns[fn_name], f"{spec.origin.split('site-packages/')[-1]}:{item.lineno}"
    raise LookupError(f"{qualname} not found in {spec.origin}")


def check_optim(cell, cfg):
    from nemo.core.optim.lr_scheduler import AVAILABLE_SCHEDULERS
    from nemo.core.optim.optimizers import AVAILABLE_OPTIMIZERS, get_optimizer, parse_optimizer_args

    d = cell["run_dir"]
    optim = cfg.model.optim
    name = optim.name
    try:
        get_optimizer(name)
        say(d, "checked", f"model.optim.name={name} resolves in NeMo 1.23's optimizer registry "
                          f"(nemo/core/optim/optimizers.py get_optimizer) to {AVAILABLE_OPTIMIZERS[name].__name__}")
    except ValueError as exc:
        if "CUDA must be available" in str(exc):
            say(d, "checked", f"model.optim.name={name} is in NeMo 1.23's optimizer registry (get_optimizer then "
                              "needs CUDA: the container's GPU)")
        else:
            say(d, "defect", f"NeMo 1.23 cannot resolve model.optim.name={name}: 'Cannot resolve optimizer' "
                             f"(nemo/core/optim/optimizers.py; it has {', '.join(sorted(AVAILABLE_OPTIMIZERS))}) "
                             f"(model.optim.name; fix: distributed_fused_adam (SFT) or fused_adam (LoRA / P-tuning) "
                             "for NeMo 1.x; mcore_distributed_optim is NeMo 2.0's)")
            return
    args = OmegaConf.to_container(optim, resolve=True)
    args.pop("name", None)
    args.pop("sched", None)
    try:
        parse_optimizer_args(name, args)
        say(d, "checked", f"model.optim arguments parse (parse_optimizer_args): {', '.join(sorted(args))}")
    except Exception as exc:
        say(d, "defect", f"NeMo's parse_optimizer_args refuses model.optim: {one_line(exc)} (model.optim; fix: the "
                         "keys the optimizer takes)")
    sched = optim.get("sched")
    if sched is not None:
        if sched.name in AVAILABLE_SCHEDULERS:
            say(d, "checked", f"model.optim.sched.name={sched.name} resolves in NeMo's scheduler registry (lr_scheduler.py)")
        else:
            say(d, "defect", f"NeMo 1.23 cannot resolve model.optim.sched.name={sched.name} (lr_scheduler.py) "
                             f"(model.optim.sched.name; fix: one of {', '.join(sorted(AVAILABLE_SCHEDULERS))})")


def base_config(cell):
    """The base model's config: the .nemo's own when it is here, else the plan's dimensions."""
    path = cell["restore_from_path"]
    if cell.get("restore_here"):  # here and a .nemo (the kit side said so, or why not)
        import tarfile

        with tarfile.open(path) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
            return OmegaConf.create(tar.extractfile(member).read().decode()), f"{path}'s model_config.yaml"
    m = cell["model"]
    return OmegaConf.create(m), "the plan's model dimensions (the .nemo is on the cluster)"


def check_merge(cell, cfg):
    d = cell["run_dir"]
    from nemo.core.connectors.save_restore_connector import SaveRestoreConnector  # noqa: F401 (what restore uses)

    base, where = base_config(cell)
    merge, at = from_source("nemo.collections.nlp.parts.mixins.nlp_adapter_mixins", "NLPAdapterModelMixin.merge_cfg_with",
                            {"OmegaConf": OmegaConf, "open_dict": open_dict, "DictConfig": DictConfig})
    holder = types.SimpleNamespace(restore_from=lambda path, return_config=True, **kw: base)
    merged = merge(holder, cfg.model.restore_from_path, cfg)
    if cell.get("restore_here"):  # NeMo builds the .nemo's model, whatever the recipe planned: the same one?
        plan_m = cell["model"]
        dims = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups")
        held = {k: base.get(k) or (base.get("num_attention_heads") if k == "num_query_groups" else None) for k in dims}
        off = [f"{k}={held[k]} (plan {plan_m[k]})" for k in dims if held[k] is not None and held[k] != plan_m[k]]
        if off:
            say(d, "defect", f"{cfg.model.restore_from_path} holds another model than the plan's: {', '.join(off)} "
                             f"({where}; NeMo builds the .nemo's model, so the plan's layout, memory and time are "
                             "another model's) (model.nemo_path; fix: point model.nemo_path at the recipe model's "
                             ".nemo, or choose the model=... it holds)")
    want = cell["plan"]
    got = {"tensor_model_parallel_size": merged.get("tensor_model_parallel_size"),
           "pipeline_model_parallel_size": merged.get("pipeline_model_parallel_size"),
           "micro_batch_size": merged.get("micro_batch_size"), "global_batch_size": merged.get("global_batch_size")}
    off = [f"{k}={got[k]} (plan {want[k]})" for k in got if got[k] != want[k]]
    if off:
        say(d, "defect", f"after NeMo's restore merge (merge_cfg_with, {at}) the model runs with {', '.join(off)} "
                         "(model.data.train_ds.micro_batch_size / global_batch_size override model.*; fix: re-render so "
                         "they agree with the plan)")
    else:
        say(d, "checked", f"fine-tuning restore merge (merge_cfg_with executed from {at}) on {where}: TP "
                          f"{got['tensor_model_parallel_size']} PP {got['pipeline_model_parallel_size']} MBS "
                          f"{got['micro_batch_size']} GBS {got['global_batch_size']}, precision {merged.get('precision')}")
    return merged


class _Reached(Exception):
    """add_adapter got past its preconditions to the model's own modules (not built here)."""


def check_precision(cell, merged):
    """The precision the model is built in: NeMo's torch_dtype_from_precision (utils_funcs.py; the module imports
    sklearn, so the function is run from its source) on the merged config's precision (merge_cfg_with copies
    trainer.precision there), as MegatronBaseModel.__init__ calls it (megatron_base_model.py:125)."""
    import typing

    import torch

    d = cell["run_dir"]
    fn, at = from_source("nemo.collections.nlp.parts.utils_funcs", "torch_dtype_from_precision",
                         {"torch": torch, "Union": typing.Union, "Optional": typing.Optional})
    try:
        dtype = fn(merged.get("precision"))
    except ValueError as exc:
        say(d, "defect", f"NeMo 1.23's torch_dtype_from_precision ({at}, from MegatronBaseModel.__init__, "
                         f"megatron_base_model.py:125) refuses the model's precision: {one_line(exc)} "
                         "(trainer.precision, copied to model.precision on restore; fix: bf16-mixed, 16-mixed or 32)")
        return False
    say(d, "checked", f"precision {merged.get('precision')}: NeMo's torch_dtype_from_precision ({at}) -> {dtype}")
    return True


def check_peft(cell, cfg, merged):
    """NeMo's PEFT set-up as megatron_gpt_finetuning.py does it: ``PEFT_CONFIG_MAP[model.peft.peft_scheme]``
    (peft_config.py), the config class built on the merged model config, then ``add_adapter``
    (nlp_adapter_mixins.py, run from its source) up to the model's modules; the LoRA adapter's parameters against
    the plan's."""
    from nemo.collections.nlp.parts.peft_config import PEFT_CONFIG_MAP, PEFTConfig, PtuningPEFTConfig

    d = cell["run_dir"]
    peft = cfg.model.get("peft")
    scheme = peft.get("peft_scheme") if peft is not None else None
    try:
        cls = PEFT_CONFIG_MAP[scheme]
    except KeyError:
        say(d, "defect", f"NeMo 1.23 has no PEFT scheme model.peft.peft_scheme={scheme}: PEFT_CONFIG_MAP[...] raises "
                         f"KeyError (nemo/collections/nlp/parts/peft_config.py; it has "
                         f"{', '.join(sorted(str(k) for k in PEFT_CONFIG_MAP if k))}) (model.peft.peft_scheme; fix: "
                         "lora, ptuning or none, or re-render)")
        return
    if cls is None:
        say(d, "checked", f"model.peft.peft_scheme={scheme}: no adapter (PEFT_CONFIG_MAP), every weight trains")
        return
    try:
        peft_cfg = cls(merged)
    except Exception as exc:
        say(d, "defect", f"NeMo 1.23's {cls.__name__} (peft_config.py) refuses the model: {one_line(exc)} "
                         f"(model.peft.*; fix: the setting it names, or re-render)")
        return
    add, at = from_source("nemo.collections.nlp.parts.mixins.nlp_adapter_mixins", "NLPAdapterModelMixin.add_adapter",
                          {"List": list, "Union": __import__("typing").Union, "PEFTConfig": PEFTConfig,
                           "PtuningPEFTConfig": PtuningPEFTConfig})

    def reached(*_a, **_k):
        raise _Reached()
    holder = types.SimpleNamespace(cfg=merged, _get_all_keys=reached)
    try:
        add(holder, peft_cfg)
    except _Reached:
        pass
    except Exception as exc:
        say(d, "defect", f"NeMo 1.23's add_adapter ({at}) refuses the run: {one_line(exc)} (model.peft / layout; fix: "
                         "the setting it names, e.g. no virtual pipeline with PEFT; or re-render)")
        return
    per_layer = sum(int(c.dim) * (int(c.in_features) + int(c.out_features))
                    for c in peft_cfg.name_key_to_cfg.values() if hasattr(c, "dim") and hasattr(c, "in_features"))
    # _check_and_add_peft_cfg (nlp_adapter_mixins.py:151) adds adapters only to the layers whose 1-based layer_number
    # is in layer_selection (all when None or empty): [0] or [33] on 32 layers adds none and nothing trains
    chosen = getattr(peft_cfg, "layer_selection", None)
    layers = [n for n in range(1, int(merged.num_layers) + 1) if n in (chosen or range(1, int(merged.num_layers) + 1))]
    got = per_layer * len(layers)
    want = cell.get("trainable")
    line = (f"{cls.__name__} from PEFT_CONFIG_MAP[{scheme}] on the merged config, add_adapter's preconditions ({at}) "
            f"pass")
    if scheme == "lora" and want:
        line += f"; LoRA adapters {got:,} trainable parameters, plan {want:,}"
        if chosen:
            line += f" (layer_selection {list(chosen)}: {len(layers)} of {int(merged.num_layers)} layers, 1-based)"
        if got != want:
            say(d, "defect", line + (" (model.peft.lora_tuning.layer_selection; fix: null, every layer as planned, or "
                                     "re-render)" if chosen and len(layers) != int(merged.num_layers) else
                                     " (model.peft.lora_tuning.adapter_dim; fix: the plan's method.lora_adapter_dim, or "
                                     "re-render)"))
            return
    say(d, "checked", line)


def sample_rows(ds, n=4, long_chars=0):
    """A few JSONL rows with the keys the prompt template names (and the label), as the run's data would have;
    the first ``long_chars`` long, so that truncation runs."""
    import re

    keys = set(re.findall(r"{(.*?)}", str(ds.get("prompt_template") or ""))) | {str(ds.get("label_key", "output"))}
    rows = []
    for i in range(n):
        rows.append({k: ("x " * (long_chars // 2) if (i == 0 and long_chars) else f"{k} {i}") for k in sorted(keys)})
    return rows


def check_data(cell, cfg, merged):
    d = cell["run_dir"]
    ds = cfg.model.data.train_ds
    packed = bool(ds.get("packed_sequence", False))
    files = list(ds.file_names) if isinstance(ds.file_names, ListConfig) else [ds.file_names]
    cls = "GPTSFTPackedDataset" if packed else "GPTSFTDataset"
    here = [f for f in files if os.path.isfile(str(f))]
    if packed:
        for f in files:
            if str(f).endswith((".jsonl", ".json")):
                say(d, "defect", f"packed_sequence: true makes NeMo 1.23 build GPTSFTPackedDataset, which np.load()s "
                                 f"{f}: a JSONL file, not the packed .npy (model.data.train_ds.file_names; fix: pack the data "
                                 "into .npy (data.packed) or set packed_sequence false)")
    for f in files:
        if f not in here:
            say(d, "not checked here", f"{f} (model.data.train_ds.file_names): cluster storage; {cls} reads it there")
    sample = None
    if not here and not packed:  # the data is the cluster's: NeMo's class on a few rows made from the settings
        import tempfile

        sample = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        rows = sample_rows(ds, long_chars=int(cell["plan"]["seq_length"]) + 64)
        sample.write("".join(json.dumps(r) + "\n" for r in rows))
        sample.close()
        here = files = [sample.name]
    if not here or len(here) != len(files):
        return
    from nemo.collections.common.tokenizers.huggingface.auto_tokenizer import AutoTokenizer
    from nemo.collections.nlp.data.language_modeling.megatron import gpt_sft_dataset
    from nemo.collections.nlp.data.language_modeling.megatron.base_dataset_utils import get_datasets_weights_and_num_samples
    from nemo.collections.nlp.data.language_modeling.megatron.blendable_dataset import BlendableDataset
    from nemo.utils import logging

    build, at = from_source("nemo.collections.nlp.models.language_modeling.megatron_gpt_sft_model",
                            "MegatronGPTSFTModel._build_dataset",
                            {"ListConfig": ListConfig, "GPTSFTDataset": gpt_sft_dataset.GPTSFTDataset,
                             "GPTSFTPackedDataset": gpt_sft_dataset.GPTSFTPackedDataset, "GPTSFTChatDataset": None,
                             "get_datasets_weights_and_num_samples": get_datasets_weights_and_num_samples,
                             "BlendableDataset": BlendableDataset, "logging": logging})
    tok = AutoTokenizer(cell["tokenizer_dir"], use_fast=True)
    model = types.SimpleNamespace(cfg=merged, trainer=types.SimpleNamespace(max_steps=cfg.trainer.max_steps),
                                  tokenizer=tok, sep_id=None, virtual_tokens=cell["virtual_tokens"])
    data_cfg = ds.copy()
    data_cfg.max_steps = cfg.trainer.max_steps
    if sample is not None:
        data_cfg.file_names = [sample.name]
    try:
        dataset = build(model, data_cfg, is_train=False)[0]
        item = dataset[0]
    except Exception as exc:
        if sample is not None:
            os.unlink(sample.name)
            say(d, "defect", f"NeMo 1.23's {cls} refuses the run's data settings on rows made from them: "
                             f"{one_line(exc) if str(exc) else type(exc).__name__} (gpt_sft_dataset.py "
                             "_maybe_validate_prompt_template / _process_example; model.data.train_ds.prompt_template, "
                             "label_key, truncation_field, truncation_method; fix: the setting it names, or re-render)")
            return
        say(d, "defect", f"NeMo 1.23's {cls} cannot read {here[0]}: {one_line(exc)} (model.data.train_ds; fix: the file "
                         f"{cls} expects{' (packed .npy)' if packed else ' (JSONL with the prompt template keys)'})")
        return
    if sample is not None:
        os.unlink(sample.name)
        n = len(item.get("input_ids", []))
        say(d, "checked", f"{type(dataset).__name__} (MegatronGPTSFTModel._build_dataset executed from {at}) on "
                          f"{len(dataset)} rows made from the run's prompt template and keys (the data is the "
                          f"cluster's), the first truncated to {n} tokens; the template's rules hold")
        return
    ids = item.get("input_ids", item.get("input_ids"))
    n = len(ids) if ids is not None else 0
    say(d, "checked", f"{type(dataset).__name__} (MegatronGPTSFTModel._build_dataset executed from {at}) on {here[0]}: "
                      f"{len(dataset)} rows, first item {n} tokens with a byte-level stand-in tokenizer (the .nemo's "
                      f"SentencePiece is on the cluster); the plan assumes up to {cell['plan']['seq_length']} per row")


def main():
    cells = json.load(sys.stdin)
    import nemo

    say("", "version", nemo.__version__)
    for cell in cells:
        d = cell["run_dir"]
        try:
            cfg = OmegaConf.load(cell["config"])
            check_optim(cell, cfg)
            if cell["finetune"]:
                merged = check_merge(cell, cfg)
                check_peft(cell, cfg, merged)
                check_precision(cell, merged)
                if not cell.get("restore_here") and not cell.get("restore_problem"):
                    say(d, "not checked here", f"{cfg.model.restore_from_path} (model.restore_from_path): the base .nemo "
                                               "on cluster storage (weights, tokenizer)")
                check_data(cell, cfg, merged)
            else:
                say(d, "not checked here", "pretraining data: Megatron indexed files on cluster storage "
                                           "(model.data.data_prefix)")
            say(d, "not checked here", "the model itself: NeMo 1.23 builds it with Apex and megatron-core 0.5 on GPUs")
        except Exception as exc:
            say(d, "defect", f"NeMo 1.23 stopped the check: {one_line(exc)} (nemo.yaml; fix: the setting it names)")
        say(d, "done", "")


if __name__ == "__main__":
    main()

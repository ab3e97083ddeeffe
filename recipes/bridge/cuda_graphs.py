"""train.cuda_graphs=layer for engine=bridge: per-layer CUDA graphs as megatron-core 0.16.1 and Bridge 0.3.1 run them.

What is rendered, and why this implementation (paths under site-packages; TE = Transformer Engine 2.12, the image's):

- ``cuda_graph_impl: transformer_engine`` (megatron/core/transformer/transformer_config.py:776). NVIDIA's MLPerf
  v4.1 Llama 2 70B LoRA scripts (LAYER_CUDA_GRAPH=1 -> the conf's ``enable_cuda_graph``) capture each decoder
  layer's forward and backward with TE's ``make_graphed_callables`` over ``decoder.layers`` and hand the graphs to
  ``decoder.cuda_graphs`` (training_results_v4.1 NVIDIA/benchmarks/llama2_70b_lora/implementations/
  eos_n8_ngc24.09_nemo/custom_callbacks.py:101-144 ``capture_cuda_graph``, called from on_train_start :260-262,
  with fp8_weight_caching and the micro-batch ``_order``). megatron-core 0.16.1's ``transformer_engine`` path is that
  capture: ``TECudaGraphHelper`` (transformer/cuda_graphs.py:1668-2300) calls ``make_graphed_callables`` on every
  graphable decoder layer with ``_order``, ``fp8_weight_caching=True`` (:2109-2179), and Bridge 0.3.1 drives it
  (training/train.py:242-250 builds the helper, :335-346 captures after ``cuda_graph_warmup_steps``, megatron-core's
  default 3). ``local`` is megatron-core's own ``CudaGraphManager`` (:1368), a different capture (its graphs
  recorded during the first step, one mempool per micro batch under PP), not what those runs measured.
- ``cuda_graph_scope`` left at its default ("full" -> ``[]`` in __post_init__, transformer_config.py:1688-1711):
  the whole layer, as MLPerf graphed it.
- ``use_te_rng_tracker: true`` (USE_TE_RNG_TRACKER): Bridge's GPT provider asserts it for any cuda_graph_impl
  (models/gpt_provider.py:213-217), and ``ConfigContainer`` copies it to ``rng.te_rng_tracker`` (training/
  config.py:1429-1430) for the seeding (training/initialize.py:199-205, ``use_cudagraphable_rng``).
- ``NCCL_GRAPH_REGISTER=0`` in the job's environment (GRAPH_ENV): the kit renders
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (recipes/bridge/__init__.py env), and on sm < 100
  ``TECudaGraphHelper`` asserts that NCCL's graph registration is off with it (cuda_graphs.py:1682-1688).
- unpacked fine-tuning rows padded to ``train.seq_length`` (``dataset_kwargs.pad_to_max_length``): a graph replays
  fixed shapes (the static inputs are ``seq_length / CP (/ TP with SP) x micro batch x hidden``, module.py:225-251,
  transformer_layer.py:920-940), and Bridge's SFT collator otherwise pads each micro batch to its own longest row
  (data/datasets/sft.py:698-703).

What megatron-core / Bridge refuse with it is refused at the door (:mod:`vdkit.rules.cuda_graphs`), and the bytes
its static buffers keep are the plan's (:mod:`vdkit.planner.cuda_graphs`).
"""
from __future__ import annotations

GRAPH_IMPL = "transformer_engine"  # megatron-core's cuda_graph_impl for train.cuda_graphs=layer (see above)
RNG_TRACKER = "use_te_rng_tracker"  # the provider field Bridge asserts for CUDA graphs (gpt_provider.py:213)
GRAPH_ENV = {"NCCL_GRAPH_REGISTER": "0"}  # with expandable_segments (cuda_graphs.py:1682-1688)


def model_fields(recipe) -> dict:
    """The model (provider) fields train.cuda_graphs renders: none for eager."""
    if recipe.train.cuda_graphs != "layer":
        return {}
    return {"cuda_graph_impl": GRAPH_IMPL, RNG_TRACKER: True}


def env(recipe) -> dict:
    """The job's environment for train.cuda_graphs (GRAPH_ENV with per-layer graphs)."""
    return dict(GRAPH_ENV) if recipe.train.cuda_graphs == "layer" else {}


def check(asked, cfg, plan, rep) -> bool:
    """`vdkit check`: per-layer CUDA graphs as the ranks will hold them, ``asked`` the loaded config, ``cfg`` after
    Bridge's runtime_config_update. False (a defect reported) when a rank would refuse or not graph what was asked."""
    want = plan.recipe.train.cuda_graphs == "layer"
    impl, scope = getattr(cfg.model, "cuda_graph_impl", "none"), getattr(cfg.model, "cuda_graph_scope", None)
    where = "model.cuda_graph_impl"
    if want and impl != GRAPH_IMPL:
        rep.defect(f"the plan asks for per-layer CUDA graphs (train.cuda_graphs=layer) but megatron-core reads "
                   f"cuda_graph_impl={impl!r}: the job would run {'eager' if impl == 'none' else impl}", where,
                   f"set {where}: {GRAPH_IMPL}, or re-render")
        return False
    if impl == "none":
        return True
    if not want:  # a hand edit: the render's environment keeps expandable segments without GRAPH_ENV
        rep.defect(f"cuda_graph_impl={impl} in bridge.yaml, but the run was rendered eager (train.cuda_graphs=none): its "
                   "environment keeps PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True without NCCL_GRAPH_REGISTER=0, "
                   "which megatron-core asserts on H100 / H200 (transformer/cuda_graphs.py:1682-1688)", where,
                   "render the run with train.cuda_graphs=layer instead of editing bridge.yaml")
        return False
    if not (getattr(cfg.model, RNG_TRACKER, False) or getattr(cfg.rng, "te_rng_tracker", False)):
        rep.defect(f"cuda_graph_impl={impl} without Transformer Engine's RNG tracker: Bridge's provider refuses it "
                   "at model build on every rank (models/gpt_provider.py:213-217)", f"model.{RNG_TRACKER}",
                   f"set model.{RNG_TRACKER}: true (vdkit render ... train.cuda_graphs=layer writes it)")
        return False
    rep.checked(f"megatron-core reads cuda_graph_impl={impl}, scope {list(scope or []) or 'the whole layer'}, "
                f"warm-up {cfg.model.cuda_graph_warmup_steps} steps, Transformer Engine's RNG tracker on "
                f"(Bridge's setup: rng.te_rng_tracker={cfg.rng.te_rng_tracker})")
    return True

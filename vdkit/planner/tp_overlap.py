"""Tensor-parallel collectives that Transformer Engine's userbuffers hide behind a layer's GEMMs.

Where the rendered job turns TP communication overlap on (the engine says so through the registry:
its spec's ``tp_comm_overlap``; Bridge's ``comm_overlap.tp_comm_overlap``, TP >= 2 with sequence
parallelism), each of a layer's all-gathers (AG) and reduce-scatters (RS) runs beside one GEMM, and only
what outlasts that GEMM is exposed. Bridge 0.3.1 renders no ``tp_comm_overlap_cfg``, so megatron-core 0.16's
defaults (model_parallel_config.py ``tp_comm_bulk_wgrad`` / ``tp_comm_bulk_dgrad`` / ``tp_comm_overlap_ag`` /
``tp_comm_overlap_rs`` on, ``tp_comm_overlap_rs_dgrad`` off) pick Transformer Engine's default method per GEMM
(TE 2.12 ``pytorch/module/base.py:267-277``, ``initialize_ub``'s ``methods``):

- **ring_exchange** (qkv_fprop, fc1_fprop: the input AG; proj_dgrad, fc2_dgrad: the output gradient's AG).
  ``CommOverlapP2PBase::split_overlap_ag`` (common/comm_gemm_overlap/comm_gemm_overlap.cpp) runs the GEMM in TP
  chunks, the local chunk first, and sends / receives one chunk per step beside each of the first TP - 1 GEMM
  chunks: exposed = max(0, AG - (TP - 1) / TP x GEMM).
- **pipeline** (proj_fprop, fc2_fprop: the output RS), 4 splits (base.py:304). ``CommOverlapBase::split_overlap_rs``
  reduce-scatters chunk i beside GEMM chunk i + 1 (``rs_overlap_first_gemm`` false): the last chunk's RS
  follows the last GEMM chunk, never hidden; exposed = RS / 4 + max(0, 3/4 RS - 3/4 GEMM).
- **bulk** (qkv_wgrad, fc1_wgrad: the input gradient's RS beside the weight-gradient GEMM,
  ``CommOverlapBase::bulk_overlap``): exposed = max(0, RS - wgrad GEMM). The other bulk pair (qkv_dgrad,
  fc1_dgrad: re-gathering the input for the wgrad GEMM) is not counted, as the unoverlapped model does not count
  it (TE's NCCL path issues it asynchronously beside the same dgrad GEMM: layernorm_linear.py:685).
- **A frozen weight** (PEFT's base) runs no wgrad GEMM, and under the bulk wgrad overlap TE 2.12 would then never
  issue that RS (layernorm_linear.py:727-728, 755-756, 781: each rank would keep its own partial sum). So the
  rendered PEFT job switches both bulk overlaps off (Bridge's ``model.tp_comm_bulk_wgrad`` / ``tp_comm_bulk_dgrad``
  false, recipes/bridge/config.py, which ``vdkit check`` holds it to), and TE reduce-scatters the QKV / fc1 input
  gradient with NCCL after the dgrad GEMM (layernorm_linear.py:757-766): nothing runs beside it, exposed whole; the
  dgrad GEMM runs on every SM (no bulk kernel beside it, no margin).
- LoRA on the QKV projection (Bridge's ``target_modules: [linear_qkv]``; fc1's adapter alike) has TE return the norm output
  (megatron/bridge/peft/utils.py:138), and TE then gathers the QKV input with NCCL, not userbuffers
  (layernorm_linear.py:189-191 ``not return_layernorm_output``): exposed whole. With the overlap on, Bridge does
  not ask TE for the gathered norm output (utils.py:146), so the adapter gathers its input itself
  (utils.py:616 ``gather_from_sequence_parallel_region``: one more AG forward, its RS backward): exposed whole.

The overlap's price, never hidden: a pipeline or bulk overlap's communication kernel holds 16 SMs
(base.py:301 ``num_sm``) and its GEMM runs on the rest (base.py:303 ``set_sm_margin``; comm_gemm_overlap.cpp:99
``_math_sms = sm_count - num_comm_sm``), so those GEMMs (proj and fc2 forward, QKV and fc1 input gradients, and
their weight gradients where the weights train) take SMs / (SMs - 16) as long; ring_exchange copies on the copy
engines (``use_ce``, one SM, no margin).

A run may name its own userbuffers settings per GEMM (``parallelism.tp_comm_overlap_cfg``: a file in conf/tp_overlap/,
Transformer Engine's ``ub_cfgs`` keys, which the Bridge engine renders as ``comm_overlap.tp_comm_overlap_cfg``). TE 2.12
merges each GEMM's entry into its default (base.py:436-443 ``ub_cfg.update``), and so does :func:`settings`; the price
follows the merged settings: a GEMM whose overlap sets ``set_sm_margin`` runs on SMs - ``num_sm``, one that does not on
every SM (NVIDIA's tuned configs run their bulk overlaps so: NeMo-Framework-Launcher conf/training/tp_overlap/*.yaml,
Megatron-Bridge 0.3.1 training/comm_overlap.py's presets); a reduce-scatter by ``ring_exchange``
(``CommOverlapP2PBase::split_overlap_rs``: TP GEMM chunks, each chunk's send beside the next chunk's GEMM, the local
chunk last) is exposed as an AG ring is, max(0, RS - (TP - 1) / TP x GEMM); ``num_splits`` sets a pipeline's chunks.

Each collective's bytes and time are the unoverlapped model's (vdkit.planner.predict: an AG or RS is half of the
all-reduce it prices); each GEMM's time is its FLOPs on this GPU at the fitted GEMM efficiency, as the compute term's.
Not modelled: FP8 AG buffers (``fp8_buf``: half the bytes of the gathers), atomic GEMMs (``atomic_gemm``), the bulk
kernels' own SMs beside a GEMM that runs on every SM, and the longer GEMMs' wider windows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

PIPELINE_SPLITS = 4  # TE 2.12 base.py:304: num_splits of a "pipeline" overlap (ring_exchange: TP)
COMM_SMS = 16  # TE 2.12 base.py:301: num_sm of a "pipeline" or "bulk" overlap's kernel, taken from its GEMM (margin)
# TE 2.12 initialize_ub's default method per GEMM (base.py:267-277; "external" wgrad overlaps are not rendered)
METHODS = {"qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
           "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
           "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk"}

Pairs = Tuple[Tuple[float, float], ...]  # (collective seconds, GEMM seconds at 100 % of peak) per collective


def default_setting(name: str) -> dict:
    """Transformer Engine 2.12's userbuffers setting of GEMM ``name`` (base.py:292-311 ``get_default_config``):
    its method, the SMs its communication kernel holds, whether its GEMM gives them up, and a pipeline's splits."""
    method = METHODS[name]
    ring = method == "ring_exchange"
    return {"method": method, "num_sm": 1 if ring else COMM_SMS, "set_sm_margin": not ring,
            "num_splits": None if ring else PIPELINE_SPLITS}


def settings(recipe) -> Dict[str, dict]:
    """Each GEMM's userbuffers setting as the rendered job runs it: TE's default, updated by the run's
    ``parallelism.tp_comm_overlap_cfg`` entry for that GEMM (TE 2.12 base.py:436-443)."""
    from vdkit.composition.conftree import tp_overlap_source

    named = tp_overlap_source(recipe.parallelism.tp_comm_overlap_cfg) if recipe.parallelism.tp_comm_overlap_cfg else {}
    return {name: {**default_setting(name), **named.get(name, {})} for name in METHODS}


def overlaps(recipe, tp: int) -> bool:
    """Whether ``recipe``'s rendered job laid out at ``tp`` overlaps its TP collectives with GEMMs (the engine's
    spec, read through the registry)."""
    from vdkit.recipes import engines

    return tp > 1 and engines.get(recipe.engine.name).tp_comm_overlap(recipe, tp)


def _gemm_s(recipe, tokens: float, tp: int, s_per_flop: float) -> Dict[str, float]:
    """One pass of each of a layer's four GEMMs on this GPU, seconds at 100 % of peak."""
    m = recipe.model
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    gated = getattr(m, "activation", "swiglu") == "swiglu"  # SwiGLU: gate and up in one fc1 (vdkit.planner.arch)
    weights = {"qkv": h * (h + 2 * kv), "proj": h * h, "fc1": h * f * (2 if gated else 1), "fc2": f * h}
    return {k: 2.0 * tokens * w / tp * s_per_flop for k, w in weights.items()}


def _rs_pairs(half_s: float, gemm_s: float, tp: int, setting: dict) -> Pairs:
    """An output reduce-scatter beside its forward GEMM (proj, fc2) as (seconds, window) pairs: a pipeline's last chunk
    follows the last GEMM chunk, never hidden; a ring's sends run beside the last TP - 1 of TP GEMM chunks."""
    if setting["method"] == "ring_exchange":
        return ((half_s, (tp - 1) / tp * gemm_s),)
    k = int(setting.get("num_splits") or PIPELINE_SPLITS)
    return ((half_s / k, 0.0), (half_s * (k - 1) / k, (k - 1) / k * gemm_s))


def layer_pairs(recipe, tokens: float, tp: int, half_s: float, s_per_flop: float, recompute_share: float,
                ub: Optional[Dict[str, dict]] = None) -> Pairs:
    """One layer's TP collectives in one micro batch as (seconds, window): the window is the GEMM it runs beside
    (seconds at 100 % of peak; divided by the GEMM efficiency in :class:`StageOverlap`). ``tokens`` this GPU's share
    of the micro batch's (the sequence over CP), ``half_s`` one AG or RS, ``s_per_flop`` seconds per FLOP at peak
    (the straggler included, as the compute term's), ``ub`` each GEMM's setting (:func:`settings`; TE's defaults when
    None); a recomputed forward repeats the forward's collectives."""
    ub = ub or {name: default_setting(name) for name in METHODS}
    t = _gemm_s(recipe, tokens, tp, s_per_flop)
    ring = (tp - 1) / tp
    from vdkit.planner.lora_targets import of  # method.lora_targets: QKV's and fc1's adapters ask TE alike

    lora_qkv, lora_fc1 = ("linear_qkv" in of(recipe)), ("linear_fc1" in of(recipe))  # norm output: NCCL gathers
    wgrad = 0.0 if recipe.is_peft else 1.0  # frozen base weights: NCCL RS after the dgrad GEMM, nothing beside it
    forward = ((half_s, 0.0 if lora_qkv else ring * t["qkv"]),) + _rs_pairs(half_s, t["proj"], tp, ub["proj_fprop"])
    forward += ((half_s, 0.0 if lora_fc1 else ring * t["fc1"]),) + _rs_pairs(half_s, t["fc2"], tp, ub["fc2_fprop"])
    adapters = ((half_s, 0.0),) * (lora_qkv + lora_fc1)  # each adapter's own input AG forward, its RS backward
    forward += adapters
    backward = ((half_s, ring * t["proj"]), (half_s, ring * t["fc2"]),  # output-gradient AG beside dgrad
                (half_s, wgrad * t["qkv"]), (half_s, wgrad * t["fc1"]))  # input-gradient RS beside wgrad
    backward += adapters
    return forward + backward + tuple((c * recompute_share, w * recompute_share) for c, w in forward)


def layer_margin(recipe, tokens: float, tp: int, s_per_flop: float, recompute_share: float, sms: int,
                 ub: Optional[Dict[str, dict]] = None) -> float:
    """What one layer's GEMMs lose to the overlap kernels' SMs in one micro batch (seconds at 100 % of peak, divided
    by the GEMM efficiency as the compute is): each GEMM whose setting gives up SMs (``set_sm_margin``; TE's default:
    the pipeline and bulk overlaps' - proj and fc2 forward, again when recomputed, and, where the weights train, the
    QKV and fc1 input- and weight-gradient GEMMs; a frozen base renders no bulk overlap) runs on SMs - ``num_sm``."""
    ub = ub or {name: default_setting(name) for name in METHODS}
    t = _gemm_s(recipe, tokens, tp, s_per_flop)
    bulk = 0.0 if recipe.is_peft else 1.0
    gemm = {"qkv_fprop": t["qkv"] * (1 + recompute_share), "proj_fprop": t["proj"] * (1 + recompute_share),
            "fc1_fprop": t["fc1"] * (1 + recompute_share), "fc2_fprop": t["fc2"] * (1 + recompute_share),
            "proj_dgrad": t["proj"], "fc2_dgrad": t["fc2"], "qkv_dgrad": bulk * t["qkv"], "qkv_wgrad": bulk * t["qkv"],
            "fc1_dgrad": bulk * t["fc1"], "fc1_wgrad": bulk * t["fc1"]}
    return sum(gemm[name] * s["num_sm"] / (sms - s["num_sm"]) for name, s in ub.items() if s["set_sm_margin"])


@dataclass(frozen=True)
class StageOverlap:
    """A pipeline stage's TP collectives in one micro batch as the rendered job runs them: counted whole
    (``whole_s``, the unoverlapped model's) where it does not overlap them, else its ``pairs`` and SM ``margin``
    (seconds at 100 % of peak) at GEMM efficiency ``eff``. The refit (benchmarks/bench_prediction.py) reads
    ``pairs`` and ``margin`` from the step's parts and redoes :meth:`exposed_s` at each trial efficiency."""

    whole_s: float
    eff: float
    pairs: Pairs = ()
    margin: float = 0.0

    def collectives_s(self) -> float:
        """The collectives' seconds that no GEMM hides (all of them where nothing is overlapped)."""
        return sum(max(0.0, c - w / self.eff) for c, w in self.pairs) if self.pairs else self.whole_s

    def exposed_s(self) -> float:
        """The stage's TP seconds per micro batch: the exposed collectives plus the GEMMs' time lost to the SMs."""
        return self.collectives_s() + self.margin / self.eff

    def basis_s(self) -> float:
        """What the refit's ``comm_s`` basis keeps of the TP term: the whole count where nothing is overlapped."""
        return 0.0 if self.pairs else self.whole_s

    def parts(self, micro: int) -> dict:
        """The step's TP parts (``micro`` micro batches): the collectives hidden behind GEMMs and the SMs' price."""
        hidden = sum(min(c, w / self.eff) for c, w in self.pairs)
        return {"tensor_parallel_overlapped_s": micro * hidden, "tensor_parallel_sm_margin_s": micro * self.margin / self.eff,
                "tp_margin_flops_s": self.margin,
                # lists, as plan.json gives them back (a loaded plan equals the planned one: tests/test_rundir.py)
                "tp_pairs": [list(p) for p in self.pairs]}


def stage(recipe, tokens: float, tp: int, per_collective_s: float, s_per_flop: float, recompute_share: float,
          layers: int, eff: float) -> StageOverlap:
    """The stage's ``layers`` TP collectives per micro batch (:class:`StageOverlap`): ``per_collective_s`` one
    all-reduce as the unoverlapped model prices it (2 forward, 2 backward, 2 x ``recompute_share`` recomputed per
    layer); overlapped where the rendered job overlaps them, on this GPU's SMs (hf_step_time.yaml ``compute_units``;
    a GPU it does not describe is taken as the reference GPU, as vdkit.planner.predict ranks it)."""
    whole = layers * (4 + 2 * recompute_share) * per_collective_s
    if not overlaps(recipe, tp):
        return StageOverlap(whole, eff)
    from vdkit.planner.calibration import load

    gpus, ref = load("hf_step_time")["gpus"], load("step_time")["hardware"]["reference_gpu"]
    sms = int((gpus.get(recipe.cluster.gpu_type) or gpus[ref])["compute_units"])
    ub = settings(recipe)
    pairs = tuple((c * layers, w * layers)
                  for c, w in layer_pairs(recipe, tokens, tp, per_collective_s / 2, s_per_flop, recompute_share, ub))
    margin = layers * layer_margin(recipe, tokens, tp, s_per_flop, recompute_share, sms, ub)
    return StageOverlap(whole, eff, pairs, margin)

"""Transformer Engine 1.x's CP ring: its own copies, merges and gradient accumulation per layer and micro batch
(vdkit.planner.cp_overheads), and their place in the step (vdkit.planner.predict)."""
import pytest

from vdkit.composition.config import compose
from vdkit.planner import cp_overheads as C
from vdkit.planner import predict as P

# Dell's 2-node MLPerf v4.1 row: Llama 2 70B LoRA, TP 4 CP 2, 8192-token samples, 4 micro batches, TE 1.10
DELL_2 = ["engine.transformer_engine=1.10.0", "model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic",
          "cluster.nodes=2", "train.seq_length=8192", "train.precision=fp8", "train.global_batch_size=8",
          "train.micro_batch_size=1", "parallelism.tp=4", "parallelism.pp=1", "parallelism.cp=2"]


def test_cp2_ranks_bytes_counted_by_hand_from_te_1_10():
    """In units of Q (q=1, kv=0) and of K / V (q=0, kv=1), TE 1.10 attention.py at CP 2:
    forward, rank 0: the whole output merged for step 0 (3), half of it for step 1 (1.5); rank 1: both whole (6);
    both pack K and V (2 KV). Backward, rank 0: Q, O, dO halves made contiguous (3), dQ's half copied (1), then its
    first half copied and second added (1 + 1.5); K, V into the send buffer (2), dK dV packed twice (2 + 2), copied
    (2), then half added half copied (1.5 + 1). Rank 1: K, V's half made contiguous (1), dQ copied (2) then added (3);
    send buffer (2), packed half then whole (1 + 2), half copied (1), then all added (3)."""
    assert C.rank_bytes(2, 0, 1, 0) == (4.5, 6.5) and C.rank_bytes(2, 0, 0, 1) == (2, 10.5)
    assert C.rank_bytes(2, 1, 1, 0) == (6.0, 5.0) and C.rank_bytes(2, 1, 0, 1) == (2, 10.0)


def test_every_rank_pays_more_at_a_larger_cp():
    """More ring steps, more merges and accumulations: the slowest rank's bytes grow with CP."""
    slowest = [tuple(max(C.rank_bytes(cp, r, 1.0, 0.25)[k] for r in range(cp)) for k in (0, 1)) for cp in (2, 4, 8)]
    assert slowest[0][0] < slowest[1][0] < slowest[2][0] and slowest[0][1] < slowest[1][1] < slowest[2][1]


def test_a_70b_tp4_cp2_layer_moves_a_quarter_gigabyte():
    """Q = 4096 tokens x 16 heads x 128 x 2 B = 16.8 MB, K and V = 2 x 4096 x 2 x 128 x 2 B = 4.2 MB: forward
    rank 1's 6 Q + 2 KV, backward rank 0's 6.5 Q + 10.5 KV."""
    q, kv = 4096 * 16 * 128 * 2, 2 * 4096 * 2 * 128 * 2
    forward, backward = C.layer_bytes(compose(DELL_2), 8192, 4, 2)
    assert forward == 6 * q + 2 * kv and backward == 6.5 * q + 10.5 * kv
    assert 0.25e9 < forward + backward < 0.27e9


@pytest.mark.parametrize("change,why", [
    (["parallelism.cp=1", "cluster.nodes=1"], "no ring at CP 1"),
    (["engine.transformer_engine=2.12.0"], "TE 2.x runs another ring (fp32 step outputs): not this count"),
    (["train.fp8_attention=true"], "FP8 attention takes TE's FP8 path"),
])
def test_only_te_1x_bf16_rings_pay_it(change, why):
    r = compose(DELL_2 + change)
    assert C.layer_bytes(r, 8192, 4, r.parallelism.cp) == (0.0, 0.0), why


def test_the_step_pays_the_rings_bytes_at_hbm_bandwidth(monkeypatch):
    """The 2-node row's step with the ring's traffic less the step without it is micro x layers x the slowest rank's
    bytes / HBM's 3.35 TB/s, on the slowest GPU (straggler)."""
    r = compose(DELL_2)
    step = P.predict_step(r, 4, 1, 1, "none", True)
    forward, backward = C.layer_bytes(r, 8192, 4, 2)
    expected = 4 * step.parts["straggler"] * 80 * (forward + backward) / 3.35e12  # ~0.025 s a step
    assert step.parts["cp_copies_s"] == pytest.approx(expected, rel=1e-9)
    monkeypatch.setattr(C, "layer_bytes", lambda *a, **k: (0.0, 0.0))
    without = P.predict_step(r, 4, 1, 1, "none", True)
    assert step.total_s - without.total_s == pytest.approx(expected, rel=1e-6)

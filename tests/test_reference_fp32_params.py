"""engine=reference, sharding none: Lightning Fabric's bf16-mixed over the fp32 model transformers builds keeps fp32
parameters, fp32 gradients and AdamW's fp32 m and v - the bytes conf/calibration/memory.yaml ``fp32_params_bytes``
gives the planner for it - and its plans count them (a 70B LoRA on one MI300X node was 'fits, 176.9 GB' with bf16
weights; the job would hold 276 GB of fp32 weights)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("transformers")


def test_fabric_bf16_mixed_keeps_the_bytes_the_planner_counts():
    from lightning.fabric import Fabric
    from transformers import LlamaConfig, LlamaForCausalLM

    from vdkit.planner.calibration import memory
    from vdkit.recipes.common.training_constants import GPU_PRECISION

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4))
    fabric = Fabric(accelerator="cpu", devices=1, precision=GPU_PRECISION)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = fabric.setup(model, opt)
    ids = torch.randint(0, 64, (1, 8))
    fabric.backward(model(input_ids=ids, labels=ids).loss)
    opt.step()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    weights = sum(p.numel() * p.element_size() for p in params) / n
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params) / n
    state = sum(t.numel() * t.element_size() for s in opt.optimizer.state.values() for t in s.values() if t.dim()) / n
    assert (weights, grads, state) == tuple(memory()["fp32_params_bytes"]["reference"]["fp32"])


def test_a_ddp_plan_counts_fp32_weights_and_fsdp_keeps_its_own_model():
    from vdkit.planner.plan import make_plan
    from vdkit.composition.config import compose

    ddp = make_plan(compose(["engine=reference", "model=llama2_70b", "method=lora", "cluster=xe9680_mi300x"]))
    assert ddp.memory.weights_gb == pytest.approx(4 * 69.0, rel=0.01) and not ddp.feasible
    fsdp = make_plan(compose(["engine=reference", "model=llama2_70b", "method=lora", "cluster=xe9680_mi300x",
                              "parallelism.sharding=fsdp"]))
    assert fsdp.feasible

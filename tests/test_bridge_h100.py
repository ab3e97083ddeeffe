"""docs/bridge-h100.md: every NVIDIA H100 setting the table says the Bridge path adopts is in the rendered jobs.

The table's *kit* column quotes the rendered text (in backticks); this test renders the Bridge jobs that
exercise every row (TP 2 pretraining, fine-tuning, FP8 LoRA, Llama 3.1, a writable-container site) in
memory and finds each adopted row's quoted text in them; departed rows say why in the same table.
"""
from __future__ import annotations

import re
from pathlib import Path

from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.render.prepare import prepare

DOC = Path(__file__).resolve().parents[1] / "docs" / "bridge-h100.md"
CELLS = [
    ["model=llama2_7b", "method=pretrain", "parallelism.tp=2", "parallelism.pp=1", "cluster.container_writable=true"],
    ["model=llama2_7b", "method=sft", "parallelism.tp=2", "parallelism.pp=1"],
    ["model=llama2_7b", "method=lora", "train.precision=fp8", "parallelism.distributed_optimizer=true"],
    ["model=llama3_1_8b", "method=lora", "train.seq_length=4096", "model.megatron_path=/models/llama31-8b-bridge"],
    ["model=llama3_1_70b", "method=lora", "cluster.nodes=2", "train.seq_length=4096",
     "model.megatron_path=/models/llama31-70b-bridge"],
    ["model=qwen2_5_7b", "method=lora"],
]


def _rows():
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("setting", "---"):
            rows.append(cells)
    return rows


def test_every_adopted_setting_is_in_the_rendered_jobs(tmp_path):
    text = ""
    for cell in CELLS:
        prepared = prepare(make_plan(compose(["engine=bridge", *cell])), tmp_path, check_mounts=False)
        text += "\n".join(v for v in prepared.files.values() if isinstance(v, str))
    rows = _rows()
    assert len(rows) >= 12
    adopted = [r for r in rows if r[1].startswith("adopted")]
    assert len(adopted) >= 10 and all(r[1].startswith(("adopted", "departed")) for r in rows)
    for setting, kit, source, why in adopted:
        quoted = re.findall(r"`([^`]+)`", kit)
        assert quoted and source and why, setting
        for literal in quoted:
            assert literal in text, f"{setting}: {literal!r} is not in the rendered Bridge jobs"


def test_local_cpu_runs_keep_their_own_settings():
    """The GPU-only settings are the container's: a local CPU run renders no TP overlap and no numactl."""
    from vdkit.recipes import bridge
    from vdkit.recipes.bridge.config import bridge_config

    plan = make_plan(compose(["engine=bridge", "model=tiny_llama", "method=pretrain", "data=synthetic", "cluster=local",
                              "cluster.nodes=1", "cluster.gpus_per_node=2", "parallelism.tp=2",
                              "train.global_batch_size=2", "train.seq_length=64"]))
    cfg = bridge_config(plan, "/r", "/r/checkpoints", in_container=bridge.in_container(plan))
    assert "comm_overlap" not in cfg and "numactl" not in " ".join(bridge.command(plan, "/r"))


def test_the_image_bridge_map_is_the_pinned_bridge():
    """recipes/bridge/versions.py is the one home of the image <-> Bridge map: the image the engine renders for
    ships the Bridge the kit pins (pyproject's bridge extra) and runs here."""
    from importlib import metadata

    from vdkit.recipes.bridge import versions

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert versions.bridge_of(versions.IMAGE_TAG) == versions.BRIDGE_VERSION == "0.3.1"
    assert f"megatron-bridge=={versions.BRIDGE_VERSION}" in pyproject or \
           f"megatron-bridge=={versions.BRIDGE_VERSION}" in (Path(__file__).resolve().parents[1] / "README.md").read_text()
    try:
        assert metadata.version("megatron-bridge") == versions.BRIDGE_VERSION
    except metadata.PackageNotFoundError:
        pass
    assert versions.bridge_of("nvcr.io/nvidia/nemo:26.04") == "0.4.0" and versions.bridge_of("nemo:99.01") is None

"""The published figure for a planned recipe, when it is a cell of a published table.

`vdkit plan` prints it beside the prediction, so a plan of e.g. Llama 2 7B LoRA on 4 GPUs reads
"predicted 146 min, Table 9: 102 min". A recipe is a cell when it is the published configuration: Table 9
(the guide's NeMo recipe: Dolly, unpacked, GBS 128; model x GPUs x method), Table 4 (NeMo pretraining,
model x nodes), the white paper's OPT runs (the transformers engine with FSDP on Alpaca, one node) and the
multi-node blog's Llama 3.1 runs (ZeRO-3 on MI300X, nodes x RoCE or TCP). Each figure is converted to
the recipe's own unit: minutes for ``train.target_steps`` steps (Table 4: for its 40 steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PublishedFigure:
    table: str  # validation/published/<table>.yaml
    text: str  # the figure as the source prints it, with its unit
    minutes: Optional[float]  # in minutes for `steps` steps (None: an upper bound or out of memory)
    steps: int  # the steps the minutes are for
    short: str = ""  # for a table cell when there are no minutes: "< 10", "OOM", "N/A"

    def line(self, prediction) -> str:
        """'<table>: <figure>; predicted <minutes> (<ratio>)' for `vdkit plan`."""
        out = f"{self.table}: {self.text}"
        if prediction is not None:
            mine = prediction.step_seconds * self.steps / 60.0
            out += f"; predicted {mine:,.1f} min"
            if self.minutes:
                out += f" ({mine / self.minutes:.2f}x the published)"
        return out


def published_for(recipe) -> Optional[PublishedFigure]:
    """The published figure of which ``recipe`` is the cell (None when it is no published cell)."""
    from vdkit.validation.tables import load_published

    r, t = recipe, recipe.train
    eng, shard = r.engine.name, r.parallelism.sharding
    if eng == "nemo" and r.method.name in ("lora", "ptuning", "sft") and r.data.name == "dolly" \
            and not r.data.packed and t.global_batch_size == 128 and t.micro_batch_size == 1:
        pub = load_published("table9")
        for c in pub["cells"]:
            if (c["model"], int(c["gpus"]), c["method"]) == (r.model.name, r.world_size, r.method.name):
                if c["minutes"] is None:
                    return PublishedFigure("Table 9", "N/A (not published)", None, t.target_steps, "N/A")
                foot = " (extrapolated from 50 steps)" if c.get("footnote") else ""
                return PublishedFigure("Table 9", f"{c['minutes']:g} min for {pub['steps']} steps{foot}",
                                       c["minutes"] * t.target_steps / int(pub["steps"]), t.target_steps)
    if eng == "nemo" and r.method.name == "pretrain":
        pub = load_published("training")
        for c in pub["cells"]:
            if (c["model"], int(c["nodes"])) == (r.model.name, r.cluster.nodes):
                return PublishedFigure("Table 4", f"{c['minutes']:g} min for {pub['steps']} steps",
                                       float(c["minutes"]), int(pub["steps"]))
    if eng == "reference" and shard == "fsdp" and r.data.name == "alpaca" and r.cluster.nodes == 1:
        for c in load_published("alpaca_opt")["cells"]:
            if c["model"] == r.model.name:
                if c.get("oom"):
                    return PublishedFigure("white paper (OPT on Alpaca)", "out of memory", None, t.target_steps, "OOM")
                if "below" in c:
                    return PublishedFigure("white paper (OPT on Alpaca)", f"under {c['below']} min for 3 epochs",
                                           None, t.target_steps, f"< {c['below']:g}")
                return PublishedFigure("white paper (OPT on Alpaca)", f"{c['minutes']:g} min for 3 epochs",
                                       float(c["minutes"]), t.target_steps)
    if eng == "reference" and shard == "zero3" and r.cluster.gpu_type.startswith("MI300X"):
        for c in load_published("llama31_roce")["cells"]:
            if c["model"] != r.model.name or int(c["nodes"]) != r.cluster.nodes:
                continue
            if r.cluster.nodes > 1 and bool(c["roce"]) != (r.cluster.transport == "roce"):
                continue
            return PublishedFigure("multi-node blog (Llama 3.1, MI300X)", f"{c['seconds']:g} s per epoch",
                                   float(c["seconds"]) / 60.0, t.target_steps)
    return None

"""The bridge engine's CPU shim is pinned: it fails loudly when the upstream code it answers moves.

Each patch in ``recipes/bridge/cpu_shim.py`` (and the job's loss-mask cache fix, ``job.LOSS_MASK_CACHE_BUG``)
names the upstream ``file:line`` it answers and the text that line holds; an upgrade of Megatron-Bridge / megatron-core that moves or changes one fails here
(and the shim refuses any other version at run time). Also: the TE stub never leaks into
``sys.modules`` (megatron-core keeps its non-TE path), and a child started with multiprocessing's
*spawn* (torch_dist's async checkpoint writer does) runs with the shim applied.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

try:  # not imported here: `import megatron.bridge` needs the shim on a CPU
    import importlib.util

    _HAVE_BRIDGE = importlib.util.find_spec("megatron.bridge") is not None
except (ImportError, ValueError):
    _HAVE_BRIDGE = False
pytestmark = pytest.mark.skipif(not _HAVE_BRIDGE, reason="megatron-bridge not installed (extra [bridge])")


def _site_megatron() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("megatron").submodule_search_locations[0])


def test_installed_versions_are_the_pinned_ones():
    from importlib.metadata import version

    from vdkit.recipes.bridge.cpu_shim import TESTED

    for dist, want in TESTED.items():
        assert version(dist) == want, f"{dist} changed: re-validate recipes/bridge/cpu_shim.py against it"


@pytest.mark.parametrize("patch", __import__("vdkit.recipes.bridge.cpu_shim", fromlist=["PATCHES"]).PATCHES
                         + __import__("vdkit.recipes.bridge.config", fromlist=["UPSTREAM"]).UPSTREAM
                         + __import__("vdkit.recipes.bridge.job", fromlist=["LOSS_MASK_CACHE_BUG"]).LOSS_MASK_CACHE_BUG,
                         ids=lambda p: f"{p[0]}:{p[1]}")
def test_each_patch_answers_the_upstream_line_it_names(patch):
    rel, line, text, _why = patch
    lines = (_site_megatron() / rel).read_text().splitlines()
    assert line <= len(lines), f"{rel} is shorter than line {line}: upstream moved; re-validate the shim"
    assert text in lines[line - 1], (f"{rel}:{line} no longer says {text!r} (it says {lines[line - 1].strip()!r}): "
                                     "upstream moved; re-validate recipes/bridge/cpu_shim.py, config.py (UPSTREAM) "
                                     "and job.py (LOSS_MASK_CACHE_BUG)")


def test_other_versions_are_refused(monkeypatch):
    import importlib.metadata as md

    from vdkit.recipes.bridge import cpu_shim

    real = md.version
    monkeypatch.setattr(md, "version", lambda d: "0.3.0" if d == "megatron-bridge" else real(d))
    with pytest.raises(cpu_shim.ShimVersionError, match="megatron-bridge==0.3.1, found 0.3.0"):
        cpu_shim.check_versions()


_PROBE = r"""
import json, sys
from vdkit.recipes.bridge import cpu_shim
assert cpu_shim.apply() is True and cpu_shim.apply() is True
import megatron.core.transformer.attention as att
from megatron.bridge.peft import utils as putils, module_matcher as pmatch
import megatron.bridge.peft.lora_layers as ll
import torch
print(json.dumps({"te_in_sys_modules": any(k.split('.')[0] == "transformer_engine" for k in sys.modules),
                  "mcore_have_te": att.HAVE_TE, "peft_have_te": [putils.HAVE_TE, pmatch.HAVE_TE],
                  "stub_linear": ll.te.Linear.__name__, "stream": type(torch.cuda.Stream()).__name__}))
"""


@pytest.mark.slow  # real ranks or a Bridge import in a child: minutes under load, CI runs it
def test_apply_keeps_megatron_core_off_transformer_engine():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"te_in_sys_modules": False, "mcore_have_te": False, "peft_have_te": [False, False],
                   "stub_linear": "Linear", "stream": "Stream"}


_PROBE_MODULE = r"""
def probe(q):
    from vdkit.recipes.bridge import cpu_shim
    import torch
    q.put({"applied": cpu_shim._APPLIED, "device": str(torch.cuda.current_device())})
"""

_SPAWN = r"""
import json, multiprocessing as mp, multiprocessing.spawn as sp
from probe_mod import probe

if __name__ == "__main__":
    # A rank runs as `python -m vdkit.recipes.bridge.rank`: a spawned child re-imports that main module
    # by name (multiprocessing's init_main_from_name), which applies the shim at import.
    data = sp.get_preparation_data("probe")
    data.pop("init_main_from_path", None)
    data["init_main_from_name"] = "vdkit.recipes.bridge.rank"
    sp.get_preparation_data = lambda name: data
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=probe, args=(q,))
    p.start(); got = q.get(timeout=240); p.join(60)
    print(json.dumps(got))
"""


@pytest.mark.slow  # real ranks or a Bridge import in a child: minutes under load, CI runs it
def test_the_shim_reaches_spawned_children(tmp_path):
    (tmp_path / "probe_mod.py").write_text(_PROBE_MODULE)
    script = tmp_path / "spawn_probe.py"
    script.write_text(_SPAWN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"applied": True, "device": "cpu"}


def test_the_bridge_extra_admits_the_transformers_bridges_import_needs():
    """``import megatron.bridge`` imports transformers' Qwen3-Next at module level (the models package imports
    every model bridge), which transformers 4.57 added (4.56.2's wheel has no models/qwen3_next): the bridge
    extra starts there, ends where the reference extra ends (both install into one venv), and admits the installed
    release. Sources read, not imported (``import megatron.bridge`` needs the shim and seconds)."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    site = _site_megatron() / "bridge" / "models"
    assert "from megatron.bridge.models.qwen import" in (site / "__init__.py").read_text()
    assert "qwen3_next_bridge" in (site / "qwen" / "__init__.py").read_text()
    assert "\nfrom transformers import Qwen3NextForCausalLM\n" in (site / "qwen" / "qwen3_next_bridge.py").read_text()
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = extras["project"]["optional-dependencies"]

    def pin(extra):
        (req,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == "transformers"]
        return req.specifier

    bridge = pin("bridge")
    assert Version("4.56.2") not in bridge and Version("4.57.1") in bridge, bridge
    assert Version(version("transformers")) in bridge, (bridge, version("transformers"))
    ceiling = {str(s) for s in pin("reference") if s.operator == "<"}
    assert ceiling and ceiling == {str(s) for s in bridge if s.operator == "<"}, (bridge, pin("reference"))

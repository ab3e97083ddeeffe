"""vdkit.composition.confsource: a sweep's composing does only the kit's own work (the Table 9 sweep's CPU time,
benchmarks/bench_cli_speed.py) and composes what Hydra's full compose does."""
from __future__ import annotations

from omegaconf import OmegaConf

from vdkit.composition.config import compose


def test_a_per_selection_compose_loads_none_of_hydras_run_time_config(monkeypatch):
    """Hydra's run-time groups (output, launcher, help, logging, ...: Hydra's package files and structured nodes) are
    not loaded or merged for the kit's compose, and Hydra's own hydra/config node is as it was afterwards."""
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
    from hydra.core.config_store import ConfigStore

    loaded = []
    real = ImportlibResourcesConfigSource.load_config
    monkeypatch.setattr(ImportlibResourcesConfigSource, "load_config",
                        lambda self, config_path: loaded.append(config_path) or real(self, config_path))
    compose(["model=tiny_llama", "method=sft", "cluster.nodes=1"])  # hydra.conf registered, a selection composed
    before = OmegaConf.to_container(ConfigStore.instance().load("hydra/config.yaml").node)
    loaded.clear()
    r = compose(["model=llama2_13b", "method=ptuning", "cluster.nodes=2"])  # a selection not composed before
    assert loaded == []  # before: hydra/output/default, hydra/help/default, hydra/job_logging/default, ...
    assert OmegaConf.to_container(ConfigStore.instance().load("hydra/config.yaml").node) == before
    assert (r.model.name, r.method.name, r.cluster.nodes) == ("llama2_13b", "ptuning", 2)


def test_the_per_selection_compose_is_hydras_full_compose(monkeypatch):
    """The cached, trimmed path (compose_by_groups) and Hydra's own full compose give the same recipe, for a
    selection and for the same selection served again from the cache."""
    from vdkit.composition import confsource

    overrides = ["model=llama2_70b", "method=lora", "cluster.nodes=2", "train.global_batch_size=64"]
    fast, again = compose(overrides), compose(overrides)
    monkeypatch.setattr(confsource, "split_overrides", lambda *_: None)  # every compose in full
    full = compose(overrides)
    assert fast == full and again == full

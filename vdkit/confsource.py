"""Where Hydra reads conf/ from: a search path of the kit's own, and each YAML file parsed once per process.

Hydra's ``initialize_config_dir`` asks every installed search-path plugin to extend the search path
(importing each package under ``hydra_plugins``: multistorageclient's alone costs ~0.2 s and the kit uses
none), and its file source re-parses every YAML file on every compose (a sweep composes each cell).
:func:`search_path` gives Hydra the same search path without the plugin scan; :class:`ParsedOnceSource`
is Hydra's file source whose ``load_config`` keeps the parsed YAML per file version (path, mtime, size)
and hands Hydra a fresh OmegaConf node built from a copy of it each time, so nothing composed is shared.
"""
from __future__ import annotations

import copy
import os
from functools import lru_cache

from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
from hydra._internal.core_plugins.structured_config_source import StructuredConfigSource
from hydra._internal.sources_registry import SourcesRegistry
from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from omegaconf import OmegaConf

SCHEME = "vdkitfile"  # the scheme of conf/ on the search path: Hydra picks the config source by it


@lru_cache(maxsize=512)
def _parsed(full_path: str, mtime_ns: int, size: int) -> tuple:
    """(header dict, plain data) of one YAML file version, parsed the way OmegaConf.load parses it."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    with open(full_path, encoding="utf-8") as f:
        header = ParsedOnceSource._get_header_dict(f.read(512))
        f.seek(0)
        obj = yaml.load(f, Loader=get_yaml_loader())
    if obj is not None and not isinstance(obj, (list, dict, str)):
        raise IOError(f"Invalid loaded object type: {type(obj).__name__}")
    return header, obj


class ParsedOnceSource(FileConfigSource):
    """Hydra's file config source, each file parsed once per process (see the module's docstring)."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        full_path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
        if not os.path.exists(full_path):
            raise ConfigLoadError(f"Config not found : {full_path}")
        st = os.stat(full_path)
        header, obj = _parsed(full_path, st.st_mtime_ns, st.st_size)
        cfg = OmegaConf.create() if obj is None else OmegaConf.create(copy.deepcopy(obj))
        return ConfigResult(config=cfg, path=f"{self.scheme()}://{self.path}", provider=self.provider,
                            header=dict(header))


def search_path(config_dir: str) -> ConfigSearchPathImpl:
    """Hydra's own search path for ``config_dir`` (hydra.conf, the dir, the ConfigStore), no plugins asked."""
    import importlib
    import pkgutil

    from hydra._internal import core_plugins

    for mod in pkgutil.iter_modules(core_plugins.__path__):  # Hydra's own (their ConfigStore entries, e.g.
        importlib.import_module(f"{core_plugins.__name__}.{mod.name}")  # hydra/launcher/basic): as its scan does
    registry = SourcesRegistry.instance()
    for source in (FileConfigSource, ImportlibResourcesConfigSource, StructuredConfigSource, ParsedOnceSource):
        registry.register(source)
    csp = ConfigSearchPathImpl()
    csp.append("hydra", "pkg://hydra.conf")
    csp.append("main", f"{SCHEME}://{config_dir}")
    csp.append("schema", "structured://")
    return csp


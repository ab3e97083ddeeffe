"""Where Hydra reads conf/ from: a search path of the kit's own, and each YAML file parsed once per process.

Hydra's ``initialize_config_dir`` asks every installed search-path plugin to extend the search path
(importing each package under ``hydra_plugins``: multistorageclient's alone costs ~0.2 s and the kit uses
none), and its file source re-parses every YAML file on every compose (a sweep composes each cell).
:func:`search_path` gives Hydra the same search path without the plugin scan; :class:`ParsedOnceSource`
is Hydra's file source whose ``load_config`` keeps each file version's OmegaConf node (path, mtime, size), pickled,
and hands Hydra a fresh copy of it each time, so nothing composed is shared.
"""
from __future__ import annotations

import os
import pickle
import re
from collections import OrderedDict
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Tuple

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
    """(header dict, the OmegaConf node pickled) of one YAML file version, parsed the way OmegaConf.load parses it."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    with open(full_path, encoding="utf-8") as f:
        header = ParsedOnceSource._get_header_dict(f.read(512))
        f.seek(0)
        obj = yaml.load(f, Loader=get_yaml_loader())
    if obj is not None and not isinstance(obj, (list, dict, str)):
        raise IOError(f"Invalid loaded object type: {type(obj).__name__}")
    return header, pickle.dumps(OmegaConf.create() if obj is None else OmegaConf.create(obj))


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
        header, blob = _parsed(full_path, st.st_mtime_ns, st.st_size)
        cfg = pickle.loads(blob)  # a fresh node each time (unpickling is ~6x cheaper than building one again)
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



@lru_cache(maxsize=2048)
def _parsed_override(text: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides=[text])[0]


def parse_overrides(overrides) -> list:
    """Hydra's parse of each override string (its ``Override``s, read-only to their users), each distinct string
    parsed once per process: a sweep's cells repeat theirs, and Hydra's ANTLR parser was a fifth of a cell's
    compose. A bad override raises Hydra's own exception, as ``OverridesParser.parse_overrides`` does."""
    return [_parsed_override(str(o)) for o in overrides]


# ----------------------------------------------------------------------------- one compose per group selection
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.\-]*\Z")  # no quote, interpolation, list, dict, sweep, glob


def split_overrides(overrides, groups) -> Optional[Tuple[List[str], List[str]]]:
    """(group choices, value overrides) when each override is a plain ``group=option`` or ``a.b=value`` that
    Hydra sorts the same way (a group choice changes the defaults list, a dotted key is set afterwards on the
    composed config); None for anything else (``+``, ``~``, ``hydra.*``, sweeps, quoting), which composes in full."""
    picks: List[str] = []
    values: List[str] = []
    for o in overrides:
        key, sep, value = str(o).partition("=")
        if not sep or not _KEY.match(key) or not _PLAIN_VALUE.match(value) or key.split(".")[0] == "hydra":
            return None
        if "." in key:
            values.append(o)
        elif key in groups:
            picks.append(o)
        else:
            return None
    return picks, values


def _signature(dirs) -> tuple:
    """Every YAML file Hydra may read, with its version: a cached composition is reused only while it holds."""
    out = []
    for d in dirs:
        for f in sorted(Path(d).glob("**/*.yaml")):
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


_COMPOSED: "OrderedDict[tuple, object]" = OrderedDict()


@contextmanager
def hydra_runtime_left_out():
    """For its duration, Hydra's own run-time config (output dirs, launcher, sweeper, help texts, logging, env) is
    left out of a compose: vdkit composes with Hydra but never runs as a Hydra app (vdkit.rules.overrides refuses
    hydra.*), and those groups were loaded and merged into every compose for a ``hydra`` node nothing reads - a
    third of a sweep's composing time. Hydra's ``hydra/config`` node (its HydraConf, ConfigStore) is swapped for
    one with an empty defaults list (built once) and the original put back after; the kit's own config comes out
    the same (tests/test_confsource.py)."""
    from hydra.core.config_store import ConfigStore

    group = ConfigStore.instance().repo["hydra"]  # ConfigStore's public repo: {group: {name: ConfigNode}}
    original = group["config.yaml"]
    group["config.yaml"] = _hydra_config_without_groups(original.package, original.provider)
    try:
        yield
    finally:
        group["config.yaml"] = original


@lru_cache(maxsize=4)
def _hydra_config_without_groups(package, provider):
    """Hydra's hydra/config node with an empty defaults list, built once (a structured node costs milliseconds)."""
    from hydra.conf import HydraConf
    from hydra.core.config_store import ConfigNode

    return ConfigNode(name="config.yaml", node=OmegaConf.structured(HydraConf(defaults=[])), group="hydra",
                      package=package, provider=provider)


def compose_by_groups(picks: List[str], values: List[str], dirs) -> object:
    """Hydra's composition of ``picks`` (cached per group selection and file versions), a copy of it with
    ``values`` applied by Hydra's own override step (the one its full compose runs after the defaults list).

    Needs Hydra initialised on :func:`search_path`. A sweep's cells differ mostly in values (nodes, GPUs),
    so a sweep composes once per distinct group selection. Any error is the caller's to redo in full."""
    from hydra import compose as hydra_compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    key = (tuple(picks), _signature(dirs))
    if key not in _COMPOSED:  # kept pickled: OmegaConf's own pickling copies a node ~6x faster than deepcopy
        with hydra_runtime_left_out():
            _COMPOSED[key] = pickle.dumps(hydra_compose(config_name="config", overrides=list(picks)))
        while len(_COMPOSED) > 32:
            _COMPOSED.popitem(last=False)
    cfg = pickle.loads(_COMPOSED[key])  # a copy of its own per cell: nothing composed is shared
    ConfigLoaderImpl._apply_overrides_to_config(parse_overrides(values), cfg)
    return cfg

"""What NeMo 1.23 needs to import its optimizer registry, dataset classes and config code on a CPU machine.

Run inside the NeMo 1.23 virtual environment (:mod:`vdkit.recipes.nemo.runcheck.venv`); standard library
only, imports nothing of vdkit. Two things, both at import time, nothing in site-packages edited:

- Apex and youtokentome are absent (Apex is CUDA-only; youtokentome has no wheel for this Python):
  stand-in modules whose attributes are empty classes, so NeMo's own ``try: from apex...`` branches
  run and register what the container registers (``nemo/core/optim/optimizers.py``: fused_adam, lamb,
  distributed_fused_adam). Nothing built from them is ever called here.
- The ``__init__`` of ``nemo.collections.nlp`` and ``nemo.collections.common`` imports every model
  (megatron-core 0.5, Apex, ...): those packages are entered without running their ``__init__``, so
  only the modules the check names are imported, each with its own imports.
"""
import importlib.abc
import importlib.machinery
import os
import sys
import types

STUBBED = ("apex", "youtokentome", "amp_C", "fused_layer_norm_cuda")
BARE_PACKAGES = ("nemo.collections.nlp", "nemo.collections.nlp.data", "nemo.collections.nlp.data.language_modeling",
                 "nemo.collections.nlp.data.language_modeling.megatron", "nemo.collections.nlp.parts",
                 "nemo.collections.nlp.parts.mixins", "nemo.collections.nlp.models",
                 "nemo.collections.nlp.models.language_modeling", "nemo.collections.common",
                 "nemo.collections.common.tokenizers", "nemo.collections.common.tokenizers.huggingface")


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _Meta(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def _bare(name):
    parent, _, leaf = name.rpartition(".")
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(sys.modules[parent].__path__[0], leaf)]
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__spec__.submodule_search_locations = m.__path__
    sys.modules[name] = m
    setattr(sys.modules[parent], leaf, m)


def apply():
    """Install the stand-ins and enter the bare packages (idempotent)."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    import nemo.collections  # noqa: F401  (light: the namespace only)

    for name in BARE_PACKAGES:
        if name not in sys.modules:
            _bare(name)

"""The door on a site's own config files (``--config-dir DIR``: ``DIR/cluster/NAME.yaml`` and the other groups),
held to the rules the command line has, each refusal one line naming the file and the key.

- No environment interpolation (``${oc.env:VAR}``, ``${env:VAR}``, ``${oc.decode:...}``) anywhere in the file:
  composition would resolve it into the run dir's name, the job and recipe.yaml (``partition: ${oc.env:HOME}``
  rendered ``#SBATCH --partition=/root``), exactly what :func:`vdkit.rules.overrides.refuse_env_interpolation` refuses
  on the command line.
- Every key is the group's schema key (:mod:`vdkit.composition.schema`), spelt in ASCII, holding a value of its type:
  Hydra would say only "ValidationError raised while composing config".
"""
from __future__ import annotations

from pathlib import Path

from vdkit.errors import UserError
from vdkit.rules.overrides import ENV_INTERPOLATION  # the command line's pattern, one home

_HYDRA_KEYS = ("defaults", "_self_")  # a Hydra group file may carry a defaults list: not the schema's


def _walk(data, path=()):
    """(dotted key path, value) of every leaf of ``data`` (mappings and lists)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, path + (str(k),))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, path + (f"[{i}]",))
    else:
        yield ".".join(path), data


def _schema(group: str):
    """The dataclass of config group ``group`` (VdkitConfig's field type), or None for a group it has none of."""
    import dataclasses
    import typing

    from vdkit.composition.schema import VdkitConfig

    if group not in {f.name for f in dataclasses.fields(VdkitConfig)}:
        return None
    return typing.get_type_hints(VdkitConfig)[group]


def check_user_file(group: str, path: Path, data: dict) -> None:
    """Refuse (UserError, one line naming ``path`` and the key) what the command line would not take."""
    fix_env = "write the value itself (a site file is read as written, never from this shell's environment); " \
              "secrets go in run.secrets_file"
    for key, value in _walk(data):
        if isinstance(value, str) and ENV_INTERPOLATION.search(value):
            raise UserError(f"{path}: {key}: environment interpolation ${{oc.env:...}} is refused: its value (maybe "
                            "a token, maybe a home directory) would be rendered into the job and recipe.yaml", fix_env)
    schema = _schema(group)
    if schema is None:
        return
    import dataclasses

    fields = {f.name for f in dataclasses.fields(schema)}
    for key in data:
        if key in _HYDRA_KEYS:
            continue
        if not isinstance(key, str) or not key.isascii() or not key.isidentifier():
            raise UserError(f"{path}: key {key!r} is not a {group} key (a key is a plain ASCII name)",
                            f"spell it as `vdkit plan --cfg` prints the {group} keys (e.g. nodes, gpus_per_node)")
        if key not in fields:
            close = sorted(f for f in fields if f[:3] == key[:3])[:3]
            raise UserError(f"{path}: {key} is not a {group} key",
                            f"remove it{' or use ' + ' / '.join(close) if close else ''}; "
                            f"`vdkit plan --cfg` prints every {group} key")
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    body = {k: v for k, v in data.items() if k not in _HYDRA_KEYS}
    try:
        OmegaConf.merge(OmegaConf.structured(schema), body)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"
        value = _value_at(body, str(key))
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: {key}: {value!r} is not a value of its type ({why})",
                        f"give {key} a value of its type; `vdkit plan --cfg` prints every {group} key and its "
                        "default") from None


def _value_at(data, dotted: str):
    cur = data
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return "?"
    return cur


def check_chosen_user_files(overrides, user_options) -> None:
    """:func:`check_user_file` for every site file the overrides choose (``cluster=NAME`` with NAME a file of a
    ``--config-dir``; ``user_options(group)`` maps a group's names to their files). A broken file nobody
    chose does not stop the others."""
    from vdkit.composition.files import load_yaml

    for o in overrides:
        key, sep, name = str(o).lstrip("+").partition("=")
        if not sep or "." in key or key.startswith("~"):
            continue
        path = user_options(key).get(name.strip())
        if path is not None:
            data = load_yaml(path, f"{key}={name}")
            if data is None or data == {}:  # else {key}={name} would be the schema's defaults (another cluster's)
                raise UserError(f"{path} is empty: {key}={name.strip()} would be the schema's defaults, not your "
                                f"{key}", f"write its {key} keys as `key: value` lines (`vdkit site probe`), or remove it")
            if not isinstance(data, dict):
                raise UserError(f"{path} is not a mapping of {key} keys", f"write {key} keys as `key: value` lines")
            check_user_file(key, path, data)

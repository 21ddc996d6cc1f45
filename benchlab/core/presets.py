"""Presets: named sets of params.yaml values for one scale of run, chosen by the top-level key `preset`.

`preset: cpu` (the default) replaces nothing: params.yaml's own values are the CPU quick start's. Any other
name must be a key of `presets`, and its values replace params.yaml's at the same places before the params
are checked, so `dvc exp run -S preset=gpt2_124m` moves a whole run to GPU scale with one param. To change a
value that a preset sets, change it in the preset (`-S presets.gpt2_124m.train.steps=500`): while the preset
is chosen, params.yaml's own value at that place is not used, and the env stage prints what the preset set.

`dvc exp run -S train.steps=50` writes params.yaml, so no stage can tell a value given on the command line from
one the file had. What it can tell is a value that differs from the last commit's params.yaml: one of those at
a place the chosen preset replaces is refused (`overruled`), naming both values and the preset's key to set
instead, rather than silently losing to the preset. A value committed that way is not caught.

DVC builds the stage list from params.yaml's own text before any of this runs (the variants, the profile
and parity stages, the corpus a stage depends on), so a preset may not set those keys.
"""

from typing import Any

from benchlab.core.errors import LabError, cut, shown

# Keys that dvc.yaml interpolates when DVC reads it: a preset could not change which stages exist or what
# they depend on.
FIXED = ("variants", "profile.variants", "parity.reference", "parity.variants", "data.corpus")


def dotted_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The leaf keys of a nested mapping, as `a.b.c` (an empty mapping has none)."""
    keys: list[str] = []
    for key, value in tree.items():
        full = f"{prefix}{key}"
        keys += dotted_keys(value, full + ".") if isinstance(value, dict) and value else [full]
    return keys


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s leaves in place (nested mappings merged, everything else replaced)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def _check_preset(name: str, preset: Any, base: dict[str, Any]) -> None:
    """A preset is a mapping that only replaces keys params.yaml has, and none that dvc.yaml reads itself."""
    where = f"presets.{cut(name)}"
    if not isinstance(preset, dict):
        raise LabError(f"{where}={shown(preset)} is not valid; expected a mapping of params to replace, e.g. "
                       "{model: gpt2_124m, shape: {block_size: 1024}}")
    for key in dotted_keys(preset):
        node: Any = base
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise LabError(f"{where}.{cut(key)} is not valid: params.yaml has no key {cut(key)} to replace; "
                               "a preset replaces values that params.yaml sets")
            node = node[part]
        fixed = next((f for f in FIXED if key == f or key.startswith(f + ".")), None)
        if fixed:
            raise LabError(f"{where}.{cut(key)} is not valid: dvc.yaml builds its stages from params.yaml's own "
                           f"{fixed}, so a preset cannot change it; set {fixed} itself")


def resolve(data: dict[str, Any]) -> tuple[str, dict[str, Any], list[str]]:
    """The chosen preset's name, params.yaml's mapping with its values in place (no preset keys left), and the
    keys it replaced. Every preset is checked, the chosen one or not, so a typo surfaces at once."""
    name = data.get("preset", "cpu")
    presets = data.get("presets", {}) or {}
    if not isinstance(presets, dict):
        raise LabError(f"presets={shown(presets)} is not valid; expected a mapping of preset names to params to "
                       "replace")
    base = {k: v for k, v in data.items() if k not in ("preset", "presets")}
    for key, preset in presets.items():
        _check_preset(str(key), preset, base)
    if not isinstance(name, str) or name != "cpu" and name not in presets:
        valid = ", ".join(["cpu", *(str(k) for k in presets if k != "cpu")])
        raise LabError(f"preset={shown(name)} is not valid; expected one of: {cut(valid, 400)} (the keys of presets)")
    chosen = presets.get(name) or {}
    return str(name), merged(base, chosen), dotted_keys(chosen)


def applied(data: dict[str, Any]) -> dict[str, Any]:
    """A committed run's params.yaml as its stages saw it: the chosen preset's values in place, unchecked (an
    older folder may hold keys today's params no longer know). A folder without a preset is returned as is."""
    chosen = (data.get("presets") or {}).get(data.get("preset", "cpu")) or {}
    return merged(data, chosen) if isinstance(chosen, dict) else data


def _leaf(tree: Any, dotted: str) -> Any:
    """The value at `a.b.c` in nested mappings; `_MISSING` where there is none."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


_MISSING = object()


def overruled(data: dict[str, Any], committed: Any) -> None:
    """Refuse a value params.yaml holds at a place the chosen preset replaces, where the committed params.yaml
    (`committed`, None where there is none) holds another: the user set it, and the preset would win silently."""
    name, _, replaced = resolve(data)
    if not isinstance(committed, dict):
        return
    chosen = (data.get("presets") or {}).get(name) or {}
    for key in replaced:
        mine, before, theirs = _leaf(data, key), _leaf(committed, key), _leaf(chosen, key)
        if mine is not _MISSING and mine != before and mine != theirs:
            was = "not" if before is _MISSING else shown(before)
            raise LabError(f"{key}={shown(mine)} is set in params.yaml (committed: {was}), but preset={name} replaces "
                           f"it with presets.{name}.{key}={shown(theirs)}; set presets.{name}.{key} instead (dvc exp run "
                           f"-S presets.{name}.{key}=...), or leave {key} as committed")

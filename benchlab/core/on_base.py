"""Variants written as their changes on something named: `{base: recipe, loss: chunked}` on an entry of `bases`,
and each of ttl.variants on ttl.reference's knobs. Both are put on before the knobs are read, so every variant
loads, and is recorded, as its whole settings."""

from benchlab.core.errors import LabError, cut, shown
from benchlab.core.track_sections import TtlParams


def variants_on_base(data: dict) -> dict:
    """A variant written `{base: recipe, <knob>: <value>, ...}` is bases.recipe's knobs with those changes: put on
    them here, before the knobs are read, so that each variant reads as a whole `RunSettings` (and its record keeps
    them whole) while params.yaml states only what it changes. Every stage that reads a variant lists `bases`."""
    variants, bases = data.get("variants"), data.get("bases")
    if not isinstance(variants, dict):
        return data
    bases = bases if isinstance(bases, dict) else {}
    merged = {}
    for name, changes in variants.items():
        if isinstance(changes, dict) and "base" in changes:
            base = changes["base"]
            if not isinstance(base, str) or not isinstance(bases.get(base), dict):
                raise LabError(f"variants.{cut(str(name))}.base={shown(base)} is not valid; expected one of bases: "
                               f"{', '.join(map(str, bases)) or '(none: add a bases section)'}")
            changes = {**bases[base], **{k: v for k, v in changes.items() if k != "base"}}
        merged[name] = changes
    return {**data, "variants": merged}


def ttl_on_reference(data: dict) -> dict:
    """ttl.variants as written are changes to the reference's knobs (`ttl.reference`): each is put on them here,
    before the knobs are read, so each reads as a whole `RunSettings` and a bad value is named under ttl.variants."""
    ttl = data.get("ttl")
    if not isinstance(ttl, dict) or not isinstance(ttl.get("variants"), dict):
        return data
    reference = ttl.get("reference", TtlParams.reference)
    base = (data.get("variants") or {}).get(reference) if isinstance(data.get("variants"), dict) else None
    if not isinstance(base, dict) and reference == TtlParams.reference:  # the default, in a matrix without it:
        return data  # only the ttl stages refuse it (stages/ttl.py), as the search does search.start
    if ttl["variants"] and not isinstance(base, dict):
        raise LabError(f"ttl.reference={shown(reference)} is not valid; expected one of the variants: "
                       f"{', '.join(data.get('variants') or {}) or '(none)'}")
    merged = {name: {**base, **(changes or {})} if isinstance(changes, dict) or changes is None else changes
              for name, changes in ttl["variants"].items()}
    return {**data, "ttl": {**ttl, "variants": merged}}

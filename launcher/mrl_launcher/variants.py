"""A sharing-mode variant: how `mrl lab bandit` and `mrl experiment compare` name an arm.

A spec is a registered mode (`xgrpo`) or a variant of one, `mode:field=value[:field=value …]`, optionally
ending in `-unguarded` (the same settings without the no-harm guard). A plain field is a field of `sharing:`
common to every mode (`sgt:coupling=async`) or else one of the mode's own section (`xgrpo:uniform_groups=zero`,
`sgt:rationalize=8:lam=0.2`); a dotted one is a path in `sharing:` (`prp:guard.trust_rate=0`). Values read as
YAML. The spec is the arm's name in reports; `variant_slug` is the form that fits a run id and a folder name.
"""
import re

import yaml

from mrl.errors import FailedPrecondition
from mrl_trainer.sharing import COMMON_FIELDS, SHARING_MODES

__all__ = ["UNGUARDED", "variant_settings", "variant_slug"]

UNGUARDED = "-unguarded"


def variant_settings(spec: str) -> dict:
    """A spec → its settings as dotted trainer overrides, `sharing.mode` first
    (`sgt:rationalize=8-unguarded` → {sharing.mode: sgt, sharing.sgt.rationalize: 8, sharing.guard.enabled: False}).
    Checks the form and the mode only; the values are validated with the rest of a config.
    FailedPrecondition on a bad form or an unknown mode."""
    body, unguarded = (spec[:-len(UNGUARDED)], True) if spec.endswith(UNGUARDED) else (spec, False)
    mode, *fields = body.split(":")
    if mode not in SHARING_MODES:
        raise FailedPrecondition(f"unknown sharing mode {mode!r} in {spec!r}; registered: {', '.join(SHARING_MODES)}")
    settings = {"sharing.mode": mode}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or not key:
            raise FailedPrecondition(f"{spec!r}: a variant is mode:field=value[:field=value …], not {field!r}")
        common = "." in key or key in COMMON_FIELDS
        settings[f"sharing.{key}" if common else f"sharing.{mode}.{key}"] = yaml.safe_load(value)
    if unguarded:
        settings["sharing.guard.enabled"] = False
    return settings


def variant_slug(spec: str) -> str:
    """The spec with every character a run id does not allow as `-` (`sgt:rationalize=8` → `sgt-rationalize-8`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec)


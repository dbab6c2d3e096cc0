"""YAML text to Python values, with libyaml where PyYAML was built with it: the paper configs'
sheets parse about 7x faster (0.16 s each in pure Python; every run reads nine for its fingerprints)."""

from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str) -> Any:
    """YAML text as Python values (safe types only)."""
    return yaml.load(text, Loader=_LOADER)

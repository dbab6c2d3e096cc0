"""The third-party library methods (mem0, graphiti, langmem, a_mem): one that is not installed stops
the run before it starts, with one line naming the extra that installs it."""

from __future__ import annotations

import importlib.util

import pytest

from pipeline.errors import ConfigError
from stages.methods import METHODS


@pytest.mark.parametrize("name, extra", [("mem0", "mem0"), ("graphiti", "graphiti"), ("langmem", "langmem"),
                                         ("a_mem", "a_mem")])
def test_a_missing_library_is_one_line_naming_its_extra(name, extra, monkeypatch):
    method = METHODS[name]
    METHODS[name].check_installed()  # installed here (the test install has every system)
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)
    with pytest.raises(ConfigError, match=rf"pip install -e '\.\[{extra}\]'") as e:
        method.check_installed()
    assert "\n" not in str(e.value) and method.library in str(e.value)

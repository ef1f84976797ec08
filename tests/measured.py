"""Runs as on a machine without the ``measured`` extra: the tables' root hidden, the cached source forgotten."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from simulator.cost.kernel_tables import aiconfigurator, source


@contextlib.contextmanager
def measured_tables_hidden(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside: no measured kernel tables are installed (``aiconfigurator.data_root`` finds none). The cached measured
    source is cleared on the way in and out, so no other test sees the hidden state or the state from before."""
    with monkeypatch.context() as patch:
        patch.setattr(aiconfigurator, "data_root", lambda: None)
        source._measured_source.cache_clear()
        try:
            yield
        finally:
            source._measured_source.cache_clear()

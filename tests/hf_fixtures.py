"""The real config.json files of tests/data/hf_configs, as the tests that count their layers by hand read them."""

import json
from pathlib import Path

from simulator.model.architecture import ModelSpec, load_model_file

DATA = Path(__file__).parent / "data" / "hf_configs"


def config(stem: str) -> dict:
    """The raw config.json of ``stem`` (``<owner>--<name>``)."""
    return json.loads((DATA / f"{stem}_config.json").read_text())


def load(stem: str) -> ModelSpec:
    """``stem``'s config.json as the simulator reads it."""
    return load_model_file(DATA / f"{stem}_config.json")


def named(ops, name):
    """The operator called ``name`` in an operator list."""
    return next(op for op in ops if op.name == name)

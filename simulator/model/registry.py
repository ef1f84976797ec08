"""Where shipped data lives, and how user configs are added to it: the one place that knows.

The shipped configs (``configs/models``, ``configs/gpus``, ``configs/engines``, ...) and the
validation data (``validation/*.csv``, ``validation/lengths/``) are package data under
``simulator/data/``. The repository keeps them at its top level (the project's layout), and
``simulator/data/configs`` and ``simulator/data/validation`` are symbolic links to those
folders: an editable install reads them in place, and a built wheel carries copies (setup.cfg
``package_data`` follows the links). Both are found through :mod:`importlib.resources`, so any
install works from any directory.

``$MEMWALL_CONFIG_DIR`` (a folder laid out like ``configs/``: ``models/``, ``gpus/``, ...)
adds user configs: they are searched first, and a user file with the same file name as a
shipped one replaces it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import TypeVar

from simulator.errors import InputError

CONFIG_DIR_ENV = "MEMWALL_CONFIG_DIR"

# What an empty registry is called in its error ("no shipped GPU configs found in ...").
_KIND_LABELS = {"models": "model", "gpus": "GPU", "engines": "engine profile", "interconnects": "interconnect"}


@functools.lru_cache(maxsize=1)
def data_root() -> Path:
    """The folder of the package data (``configs/`` and ``validation/`` inside it); found once per process."""
    # A zipped install would give a Traversable that is not a file-system path; the readers
    # need real paths (stat for the cache, paths in error messages), so that is refused.
    root = resources.files("simulator") / "data"
    if not isinstance(root, Path):
        raise InputError(f"the simulator package data is not on the file system ({root}): install the package unzipped")
    return root


def data_path(*parts: str) -> Path:
    """A shipped data file or folder, e.g. ``data_path("validation", "published.csv")``."""
    return data_root().joinpath(*parts)


def user_config_dir() -> Path | None:
    """``$MEMWALL_CONFIG_DIR`` when set (it must be a folder), else None."""
    value = os.environ.get(CONFIG_DIR_ENV)
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        raise InputError(
            f"{CONFIG_DIR_ENV}={value}: no such folder (it should hold models/, gpus/, ... like the shipped configs/)"
        )
    return path


def config_files(kind: str) -> list[Path]:
    """The ``*.yaml`` configs of one kind (``models``, ``gpus``, ``engines``): user's first, then shipped.

    Each group is sorted by file name; a shipped file is left out when the user's folder has one
    of the same name. No shipped file at all means a broken install: InputError, never an empty list.
    """
    return list(_listing(kind)[1])


def _listing(kind: str) -> tuple[tuple, tuple[Path, ...]]:
    """(what the listing of :func:`config_files` is a function of: each folder and its modification time, the files)."""
    shipped_dir = data_path("configs", kind)
    shipped_stamp, shipped = _yaml_files(shipped_dir)
    if not shipped:
        label = _KIND_LABELS.get(kind, kind)
        raise InputError(f"no shipped {label} configs found in {shipped_dir}: the installation is broken")
    user_dir = user_config_dir()
    if user_dir is None:
        return (str(shipped_dir), shipped_stamp), shipped
    user_stamp, user = _yaml_files(user_dir / kind)
    replaced = {path.name for path in user}
    return (str(shipped_dir), shipped_stamp, str(user_dir), user_stamp), user + tuple(p for p in shipped if p.name not in replaced)


_LISTINGS: dict[Path, tuple[int, tuple[Path, ...]]] = {}


def _yaml_files(folder: Path) -> tuple[int | None, tuple[Path, ...]]:
    """(the folder's modification time, its ``*.yaml`` files sorted); listed again only when the folder changed (its
    mtime: a file added, removed or renamed), as a sweep looks its configs up at every point. (None, ()) when the
    folder cannot be read."""
    try:
        stamp = folder.stat().st_mtime_ns
    except OSError:
        return None, ()
    listed = _LISTINGS.get(folder)
    if listed is None or listed[0] != stamp:
        listed = _LISTINGS[folder] = (stamp, tuple(sorted(folder.glob("*.yaml"))))
    return listed


Config = TypeVar("Config")

_NAMED: dict[tuple[str, tuple], Path] = {}
NAMED_KEPT = 4096
"""Names whose file :func:`find_named` remembers (forgotten all at once past this many)."""


def find_named(kind: str, name: str, load: Callable[[Path], Config],
               names: Callable[[Config], Iterable[str]]) -> Config | None:
    """The config of ``kind`` (``models``, ``gpus``) that ``name`` names, case-insensitively, or None.

    The configs of :func:`config_files` are loaded with ``load`` (every one of them, so a broken
    file is reported whatever the name) and the first whose ``names`` (its name and aliases) hold
    ``name`` is the answer. Which file that was is remembered, for the same name and the same
    listing (the files of ``$MEMWALL_CONFIG_DIR`` and of the shipped folder, listed again when a
    folder changes or the variable does), so that a sweep or a validation looking one name up at
    every point loads one file, not all of them. That file is still loaded through ``load`` (which
    reads it again when it changes) and must still carry the name.
    """
    listing, files = _listing(kind)
    wanted = name.lower()
    key = (wanted, listing)
    remembered = _NAMED.get(key)
    if remembered is not None:
        config = load(remembered)
        if wanted in (n.lower() for n in names(config)):
            return config
    configs = [load(path) for path in files]  # every file, as a listing does: a broken one is reported
    for path, config in zip(files, configs):
        if wanted in (n.lower() for n in names(config)):
            if len(_NAMED) >= NAMED_KEPT:
                _NAMED.clear()
            _NAMED[key] = path
            return config
    return None


def validation_file(*parts: str) -> Path:
    """A shipped validation file, e.g. ``validation_file("published.csv")``: the one place that knows where."""
    return data_path("validation", *parts)

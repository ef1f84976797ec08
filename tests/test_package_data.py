"""The shipped configs and validation data are package data: in the wheel, and found from any directory.

The wheel is built offline (``pip wheel --no-build-isolation``) from a copy of the source tree,
so the build leaves nothing in the checkout; setuptools >= 70.1 (the ``test`` extra) builds
wheels without the separate ``wheel`` package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.model import list_gpus, list_models, load_gpu, load_model, registry

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = {
    "configs": (".yaml", ".yml", ".json"),
    "validation": (".csv", ".json"),
}


def _tracked_data_files() -> list[str]:
    """``git ls-files configs validation`` filtered to the data suffixes that ship."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "configs", "validation"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked data files cannot be listed")
    return [name for name in out.split() if name.endswith(DATA_SUFFIXES[name.split("/")[0]])]


def _can_build_wheels() -> bool:
    """bdist_wheel comes with setuptools >= 70.1, or from the ``wheel`` package before that."""
    for module in ("setuptools.command.bdist_wheel", "wheel.bdist_wheel"):
        try:
            if importlib.util.find_spec(module) is not None:
                return True
        except ImportError:  # the parent package is not installed
            continue
    return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _can_build_wheels():
        pytest.skip("cannot build a wheel offline: needs setuptools>=70.1 or wheel (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    # symlinks=True keeps simulator/data/configs -> ../../configs a link, as in a clone.
    shutil.copytree(ROOT / "simulator", src / "simulator", symlinks=True, ignore=junk)
    shutil.copytree(ROOT / "configs", src / "configs", ignore=junk)
    shutil.copytree(ROOT / "validation", src / "validation", ignore=junk)
    out = tmp / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(src)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (built,) = out.glob("memwall-*.whl")
    return built


def test_wheel_holds_every_tracked_config_and_table(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = _tracked_data_files()
    # The layout the registry reads: configs/models/x.yaml -> simulator/data/configs/models/x.yaml.
    missing = [name for name in tracked if f"simulator/data/{name}" not in names]
    assert missing == []
    for name in (
        "simulator/data/configs/models/llama2-70b.yaml",
        "simulator/data/configs/gpus/a100-sxm4-80gb.yaml",
        "simulator/data/validation/published.csv",
        "simulator/py.typed",
        "simulator/__main__.py",
        "simulator/model/registry.py",
    ):
        assert name in names, name
    # Only data ships from the data folders (not the calibration scripts or READMEs beside them).
    extra = [n for n in names if n.startswith("simulator/data/") and not n.endswith((".yaml", ".yml", ".json", ".csv"))]
    assert extra == []


def test_unpacked_wheel_finds_its_data_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    n_models = len(list((site / "simulator" / "data" / "configs" / "models").glob("*.yaml")))
    n_gpus = len(list((site / "simulator" / "data" / "configs" / "gpus").glob("*.yaml")))
    assert n_models >= 10 and n_gpus >= 11  # what the repository shipped when this test was written
    script = (
        "import simulator\n"
        "from simulator.model import list_gpus, list_models\n"
        "from simulator.model.registry import data_path\n"
        "print(simulator.__file__)\n"
        "print(len(list_models()), len(list_gpus()))\n"
        "print(data_path('validation', 'published.csv'))\n"
    )
    # PYTHONPATH comes before the editable install's finder, so this imports the unpacked wheel.
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop(registry.CONFIG_DIR_ENV, None)
    run = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    package_file, counts, table = run.stdout.split("\n")[:3]
    assert Path(package_file).is_relative_to(site)
    assert counts == f"{n_models} {n_gpus}"
    assert Path(table).is_relative_to(site)
    assert Path(table).is_file()


def _write_gpu(folder: Path, file_name: str, name: str) -> None:
    """A copy of the shipped L4 config under another name."""
    text = (ROOT / "configs" / "gpus" / "l4.yaml").read_text(encoding="utf-8")
    lines = [f"name: {name}" if line.startswith("name:") else line for line in text.splitlines()]
    lines = [f"aliases: [{name.lower()}]" if line.startswith("aliases:") else line for line in lines]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_user_config_dir_adds_to_the_shipped_configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = [gpu.name for gpu in list_gpus()]
    _write_gpu(tmp_path / "gpus", "zz-mine.yaml", "MyGPU")
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path))
    names = [gpu.name for gpu in list_gpus()]
    # The user's file first, then every shipped one.
    assert names == ["MyGPU", *shipped]
    assert load_gpu("mygpu").name == "MyGPU"
    assert load_gpu("a100").name == "A100-SXM4-80GB"
    # No models/ folder in the user's dir: the shipped models alone.
    assert load_model("llama2-7b").name == "llama2-7b"


def test_user_file_named_like_a_shipped_one_replaces_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = len(list_gpus())
    _write_gpu(tmp_path / "gpus", "l4.yaml", "MyL4")
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path))
    names = [gpu.name for gpu in list_gpus()]
    assert len(names) == count
    assert names[0] == "MyL4"
    assert "L4" not in names


def test_missing_user_config_dir_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(InputError, match=r"MEMWALL_CONFIG_DIR=.*nope: no such folder"):
        list_gpus()


def test_an_empty_registry_is_a_broken_install_not_an_empty_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "configs" / "models").mkdir(parents=True)
    monkeypatch.setattr(registry, "data_root", lambda: tmp_path)
    monkeypatch.delenv(registry.CONFIG_DIR_ENV, raising=False)
    with pytest.raises(InputError, match=r"no shipped GPU configs found in .*gpus: the installation is broken"):
        list_gpus()
    with pytest.raises(InputError, match=r"no shipped model configs found in .*models: the installation is broken"):
        list_models()
    # A name lookup says the same, never "unknown model ...; known: " with an empty list.
    with pytest.raises(InputError, match="the installation is broken"):
        load_model("llama2-7b")
    with pytest.raises(InputError, match="the installation is broken"):
        load_gpu("a100")
    # User configs do not hide a broken install.
    _write_gpu(tmp_path / "user" / "gpus", "mine.yaml", "MyGPU")
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "user"))
    with pytest.raises(InputError, match="the installation is broken"):
        list_gpus()


def test_data_path_is_inside_the_package() -> None:
    import simulator

    table = registry.data_path("validation", "published.csv")
    assert table.is_relative_to(Path(simulator.__file__).parent)
    assert table.is_file()

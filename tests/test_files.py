"""simulator.files: every bad file is one InputError line; outputs are checked first and written whole."""

from __future__ import annotations

import errno
import json
import os

import pytest

from simulator import files
from simulator.errors import InputError
from simulator.files import (
    atomic_write,
    check_output_path,
    load_json,
    parse_json,
    parse_yaml,
    read_mapping,
    read_text,
)


def one_line(exc: pytest.ExceptionInfo[InputError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ---- reading ---------------------------------------------------------------------------

def test_utf8_with_and_without_bom_read_the_same(tmp_path):
    plain, bom = tmp_path / "plain.yaml", tmp_path / "bom.yaml"
    plain.write_bytes(b"name: x\n")
    bom.write_bytes(b"\xef\xbb\xbfname: x\n")
    assert read_text(plain) == read_text(bom) == "name: x\n"
    assert read_mapping(bom) == {"name": "x"}


def test_latin1_names_the_file_the_byte_and_its_offset(tmp_path):
    path = tmp_path / "latin.yaml"
    # "name: caf" is 9 bytes, so the Latin-1 e-acute (0xe9) sits at offset 9 on line 1.
    path.write_bytes("name: café\n".encode("latin-1"))
    with pytest.raises(InputError) as exc:
        read_text(path, "--model")
    assert one_line(exc) == f"--model {path}: not UTF-8 text: byte 0xe9 at offset 9 (line 1); save the file as UTF-8"


@pytest.mark.parametrize("name, expected", [("", "--csv: empty path; give a file name"), ("missing.csv", "no such file")])
def test_empty_and_missing_paths(tmp_path, name, expected):
    path = "" if name == "" else str(tmp_path / name)
    with pytest.raises(InputError) as exc:
        read_text(path, "--csv")
    assert expected in one_line(exc)


def test_a_folder_is_not_a_file(tmp_path):
    with pytest.raises(InputError) as exc:
        read_text(tmp_path, "--trace")
    assert one_line(exc) == f"--trace {tmp_path}: is a folder; give a file"


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"x" * 101)
    assert read_text(path, max_bytes=101) == "x" * 101
    with pytest.raises(InputError) as exc:
        read_text(path, max_bytes=100)
    assert "101 bytes, larger than the 100-byte limit" in one_line(exc)


def test_yaml_tag_that_does_not_convert_names_file_and_line():
    with pytest.raises(InputError) as exc:
        parse_yaml("a: 1\nname: !!float abc\n", "m.yaml")
    assert one_line(exc).startswith("m.yaml:2: cannot read 'abc' as float")


@pytest.mark.parametrize("text, shown", [("n: !!int +\n", "'+' as int"), ("n: !!int ''\n", "'' as int"),
                                         ("n: !!float ''\n", "'' as float")])
def test_a_tagged_empty_number_is_an_input_error_not_an_index_error(text, shown):
    # PyYAML strips the sign, then looks at the first digit of nothing: IndexError (found by the long fuzz).
    with pytest.raises(InputError) as exc:
        parse_yaml("a: 1\n" + text, "m.yaml")
    assert one_line(exc).startswith(f"m.yaml:2: cannot read {shown}")


def test_malformed_yaml_names_file_and_line():
    with pytest.raises(InputError) as exc:
        parse_yaml("a: 1\nb: [1, 2\n", "m.yaml")
    assert one_line(exc).startswith("m.yaml:3: malformed YAML")


def test_yaml_errors_quote_the_pure_python_parser_however_pyyaml_was_built(monkeypatch):
    # libyaml words this "did not find expected ',' or ']'" and drops the tab from its message; the pure-Python
    # parser's words are the ones reported, with or without libyaml.
    cases = {"a: 1\nb: [1, 2\n": "m.yaml:3: malformed YAML: expected ',' or ']', but got '<stream end>'",
             "a:\n\t- 1\n": "m.yaml:2: malformed YAML: found character '\\t' that cannot start any token"}
    for fast in ({files._FastLoader} - {None}) | {None}:
        monkeypatch.setattr(files, "_FastLoader", fast)
        for text, message in cases.items():
            with pytest.raises(InputError) as exc:
                parse_yaml(text, "m.yaml")
            assert one_line(exc) == message


def test_every_shipped_yaml_reads_the_same_with_libyaml_and_without(monkeypatch):
    import yaml

    from simulator.model.registry import data_path

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: only the pure-Python parser runs")
    assert files._FastLoader is not None  # start-up reads the shipped configs through libyaml
    paths = sorted(data_path("configs").rglob("*.yaml"))
    assert len(paths) > 50  # every model, GPU, engine profile and interconnect
    fast = [parse_yaml(path.read_text(), str(path)) for path in paths]
    monkeypatch.setattr(files, "_FastLoader", None)
    assert [parse_yaml(path.read_text(), str(path)) for path in paths] == fast


@pytest.mark.parametrize("depth, deep", [(files.MAX_NESTING, False), (files.MAX_NESTING + 1, True), (1000, True), (5000, True)])
def test_nesting_depth_limit_in_yaml_and_json(depth, deep):
    text = "[" * depth + "]" * depth
    for parse in (parse_yaml, parse_json):
        if deep:
            with pytest.raises(InputError, match="nested more than 64 levels"):
                parse(text, "d")
        else:
            assert parse(text, "d") == _nested(depth)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_yaml_aliases_are_limited():
    # 9 aliases per line: 12 lines = 108 aliases, over the limit of 100.
    text = "a: &a 1\n" + "".join(f"b{i}: [{', '.join(['*a'] * 9)}]\n" for i in range(12))
    with pytest.raises(InputError, match="more than 100 YAML aliases"):
        parse_yaml(text, "lol.yaml")
    assert parse_yaml("a: &a 1\nb: [*a, *a]\n", "ok.yaml") == {"a": 1, "b": [1, 1]}


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}'])
def test_json_refuses_non_finite_numbers(text):
    with pytest.raises(InputError, match="malformed JSON"):
        parse_json(text, "t.json")


def test_json_error_has_the_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{\n"a": 1,\n}\n', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_json(path, "--measurements")
    assert one_line(exc).startswith(f"--measurements {path}:3: malformed JSON")


def test_read_mapping_wants_a_mapping(tmp_path):
    empty, listed = tmp_path / "e.yaml", tmp_path / "l.yaml"
    empty.write_text("", encoding="utf-8")
    listed.write_text("- 1\n", encoding="utf-8")
    with pytest.raises(InputError, match="got an empty file"):
        read_mapping(empty)
    with pytest.raises(InputError, match="got a list"):
        read_mapping(listed)


# ---- outputs ---------------------------------------------------------------------------

def test_check_output_path_before_work(tmp_path):
    assert check_output_path(tmp_path / "p.png", "--plot", (".png",)) == tmp_path / "p.png"
    problems = {
        str(tmp_path / "p.txt"): "must end in one of .png",
        str(tmp_path): "must end in one of .png",
        str(tmp_path / "no" / "p.png"): "does not exist",
        "": "empty path",
    }
    for path, message in problems.items():
        with pytest.raises(InputError) as exc:
            check_output_path(path, "--plot", (".png",))
        assert message in one_line(exc)
    folder = tmp_path / "dir.png"
    folder.mkdir()
    with pytest.raises(InputError, match="is a folder"):
        check_output_path(folder, "--plot", (".png",))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_check_output_path_refuses_a_read_only_folder(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(InputError, match="not writable"):
            check_output_path(tmp_path / "out.csv", "--out")
    finally:
        tmp_path.chmod(0o700)


def test_atomic_write_replaces_whole(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old\n", encoding="utf-8")
    atomic_write(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.csv"
    path.write_text("old\n", encoding="utf-8")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(InputError) as exc:
        atomic_write(path, "new\n", "--out")
    assert one_line(exc) == f"--out: cannot write {path} (No space left on device)"
    assert path.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_failing_writer_leaves_no_file(tmp_path):
    path = tmp_path / "new.json"

    def write(handle) -> None:
        handle.write("{")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        atomic_write(path, write)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_gives_the_permissions_of_a_plain_open(tmp_path):
    atomic_write(tmp_path / "a.txt", "x")
    (tmp_path / "b.txt").write_text("x", encoding="utf-8")
    assert (tmp_path / "a.txt").stat().st_mode == (tmp_path / "b.txt").stat().st_mode


def test_strict_json_round_trip_of_written_text(tmp_path):
    path = tmp_path / "r.json"
    atomic_write(path, json.dumps({"a": 1.5}))
    assert load_json(path) == {"a": 1.5}

"""Worked examples in README.md and docs/*.md, checked against the program and rewritten from it.

The format is described in docs/README.md. In short:

* a ``<!-- doc:run id=NAME [grep="RE"] [drop="RE"] [slow] -->`` line, a fenced block of ``$ simulate ...``
  commands each followed by what it prints (only the lines matching ``grep``, without the lines
  matching ``drop``), and a ``<!-- doc:end -->`` line;
* ``<!-- doc:fig NAME[#N] /RE/ -->VALUE<!-- /doc:fig -->`` in prose or a table: VALUE is group 1 (else
  the whole match) of the first match of RE in the whole output of block NAME (of its N-th command);
* ``<!-- doc:expect NAME[#N] /RE/ -->`` (``doc:expect-not``): RE must (must not) match that output.
  It is how a conclusion in prose ("a slow-down", "the best ratio is 2:2") is tied to the program;
  the regenerator never rewrites it, so a conclusion that flips fails until a person rewrites it.

``python -m docs.regenerate`` reruns every block and rewrites each block's output and each figure in
place (``--check`` only reports; ``--fast`` skips blocks marked ``slow``); ``tests/test_docs.py``
fails on any difference. Commands run in process through click's CliRunner, from a scratch folder
that links the repository's top-level folders (so ``scenarios/...`` resolves and files a command
writes, such as a sweep's ``out/``, land outside the checkout).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_ENV = "MEMWALL_DOCS"

RUN_RE = re.compile(r"^<!-- doc:run (?P<attrs>.*?) -->$")
END_LINE = "<!-- doc:end -->"
ATTR_RE = re.compile(r'(\w+)(?:=(?:"([^"]*)"|(\S+)))?')
FIG_RE = re.compile(r"<!-- doc:fig (?P<ref>\S+) /(?P<pattern>.*?)/ -->(?P<value>.*?)<!-- /doc:fig -->")
COMPARE_RE = re.compile(
    r"<!-- doc:compare (?P<ref1>\S+) /(?P<re1>.*?)/ (?P<op><=|>=|<|>) (?P<ref2>\S+) /(?P<re2>.*?)/ -->"
)
EXPECT_RE = re.compile(r"<!-- doc:expect(?P<neg>-not)? (?P<ref>\S+) /(?P<pattern>.*?)/ -->")
COMMAND_PREFIX = "$ "
PROGRAMS = {"simulate": 1, "python -m simulator": 3}


class DocError(Exception):
    """A malformed marker or a command that cannot run; the message names the doc and line."""


@dataclass
class Command:
    text: list[str]  # the lines as written, "$ " and continuations included
    expected: list[str]  # output lines as written in the doc

    @property
    def argv(self) -> list[str]:
        joined = " ".join(line.rstrip("\\").strip() for line in self.text)[len(COMMAND_PREFIX):]
        words = shlex.split(joined)
        for program, count in PROGRAMS.items():
            if words[:count] == program.split():
                return words[count:]
        raise ValueError(f"not a simulate command: {joined}")

    @property
    def shown(self) -> str:
        return " ".join(line.rstrip("\\").strip() for line in self.text)[len(COMMAND_PREFIX):]


@dataclass
class Block:
    doc: str  # path relative to the repository
    id: str
    line: int  # 1-based line of the doc:run marker
    grep: str | None
    drop: str | None
    slow: bool
    fence_open: str
    fence_close: str
    commands: list[Command]
    start: int = 0  # index of the first content line (after the fence) in the doc's lines
    stop: int = 0  # index of the closing fence

    def select(self, output: str) -> list[str]:
        """The lines of a command's output the block shows."""
        lines = output.splitlines()
        if self.drop is not None:
            lines = [line for line in lines if not re.search(self.drop, line)]
        if self.grep is not None:
            lines = [line for line in lines if re.search(self.grep, line)]
        return lines


@dataclass
class Figure:
    doc: str
    line: int
    ref: str
    pattern: str
    value: str


@dataclass
class Expect:
    doc: str
    line: int
    ref: str
    pattern: str
    negated: bool


@dataclass
class Compare:
    doc: str
    line: int
    ref1: str
    re1: str
    op: str
    ref2: str
    re2: str


@dataclass
class Doc:
    path: Path
    lines: list[str]
    blocks: list[Block] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    expects: list[Expect] = field(default_factory=list)
    compares: list[Compare] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else str(self.path)


def doc_paths(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _attrs(text: str, where: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = ATTR_RE.match(text, pos)
        if match is None:
            raise DocError(f"{where}: cannot read the attributes {text[pos:]!r}")
        value = match.group(2) if match.group(2) is not None else match.group(3)
        out[match.group(1)] = value
        pos = match.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    unknown = set(out) - {"id", "grep", "drop", "slow"}
    if unknown:
        raise DocError(f"{where}: unknown attribute(s) {sorted(unknown)}; known: id, grep, drop, slow")
    if not out.get("id"):
        raise DocError(f"{where}: a doc:run marker needs id=NAME")
    for key in ("grep", "drop"):
        if out.get(key) is not None:
            try:
                re.compile(out[key] or "")
            except re.error as exc:
                raise DocError(f"{where}: {key}={out[key]!r} is not a regular expression: {exc}") from None
    return out


def _prose(line: str) -> str:
    """The line without its `code spans` (where markers are quoted, not used)."""
    return "".join(part for k, part in enumerate(line.split("`")) if k % 2 == 0)


def parse(path: Path) -> Doc:
    text = path.read_text(encoding="utf-8")
    doc = Doc(path=path, lines=text.split("\n"))
    lines = doc.lines
    i = 0
    fence: str | None = None  # the fence of an ordinary code block being skipped (examples of markers)
    while i < len(lines):
        line = lines[i]
        where = f"{doc.name}:{i + 1}"
        if fence is not None or line.startswith("```"):
            if fence is None:
                fence = line[: len(line) - len(line.lstrip("`"))]
            elif line.strip() == fence:
                fence = None
            i += 1
            continue
        prose = _prose(line)
        for match in COMPARE_RE.finditer(prose):
            doc.compares.append(Compare(doc.name, i + 1, match["ref1"], match["re1"], match["op"], match["ref2"], match["re2"]))
        for match in FIG_RE.finditer(prose):
            doc.figures.append(Figure(doc.name, i + 1, match["ref"], match["pattern"], match["value"]))
        for match in EXPECT_RE.finditer(prose):
            doc.expects.append(Expect(doc.name, i + 1, match["ref"], match["pattern"], bool(match["neg"])))
        if "<!-- doc:fig " in prose and not FIG_RE.search(prose):
            raise DocError(f"{where}: a doc:fig marker must read <!-- doc:fig NAME /RE/ -->VALUE<!-- /doc:fig --> on one line")
        match = RUN_RE.match(line)
        if match is None:
            if line.startswith("<!-- doc:run"):
                raise DocError(f"{where}: a doc:run marker must be a line of its own: <!-- doc:run id=NAME ... -->")
            i += 1
            continue
        attrs = _attrs(match["attrs"], where)
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise DocError(f"{where}: a doc:run marker must be followed by a fenced block")
        block_fence = lines[i + 1][: len(lines[i + 1]) - len(lines[i + 1].lstrip("`"))]
        close = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == block_fence), None)
        if close is None or close + 1 >= len(lines) or lines[close + 1].strip() != END_LINE:
            raise DocError(f"{where}: block {attrs['id']!r} must end with its fence and then {END_LINE}")
        commands: list[Command] = []
        j = i + 2
        while j < close:
            if lines[j].startswith(COMMAND_PREFIX):
                cmd = [lines[j]]
                while cmd[-1].endswith("\\") and j + 1 < close:
                    j += 1
                    cmd.append(lines[j])
                commands.append(Command(cmd, []))
            elif commands:
                commands[-1].expected.append(lines[j])
            elif lines[j].strip():
                raise DocError(f"{doc.name}:{j + 1}: block {attrs['id']!r}: text before the first '$ ' command")
            j += 1
        if not commands:
            raise DocError(f"{where}: block {attrs['id']!r} has no '$ simulate ...' command")
        for command in commands:
            try:
                _ = command.argv  # parse now, to fail at the marker
            except ValueError as exc:
                raise DocError(f"{where}: block {attrs['id']!r}: {exc}") from None
            while command.expected and not command.expected[-1].strip():
                command.expected.pop()
        doc.blocks.append(Block(
            doc=doc.name, id=str(attrs["id"]), line=i + 1, grep=attrs.get("grep"), drop=attrs.get("drop"),
            slow="slow" in attrs, fence_open=lines[i + 1], fence_close=lines[close], commands=commands,
            start=i + 2, stop=close,
        ))
        i = close + 2
    return doc


def parse_all(paths: list[Path] | None = None) -> list[Doc]:
    docs = [parse(path) for path in (paths if paths is not None else doc_paths())]
    seen: dict[str, str] = {}
    for doc in docs:
        for block in doc.blocks:
            if block.id in seen:
                raise DocError(f"{doc.name}:{block.line}: block id {block.id!r} is already used in {seen[block.id]}")
            seen[block.id] = f"{doc.name}:{block.line}"
    return docs


@contextmanager
def scratch_folder(root: Path = ROOT) -> Iterator[Path]:
    """A temporary folder linking the repository's top-level entries (not out/): commands run there."""
    with tempfile.TemporaryDirectory(prefix="memwall-docs-") as tmp:
        folder = Path(tmp)
        for entry in root.iterdir():
            if entry.name not in {"out", ".git", ".venv"}:
                (folder / entry.name).symlink_to(entry)
        yield folder


class Runner:
    """Runs commands in process, once each (a command quoted by two blocks runs once)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.cache: dict[tuple[str, ...], str] = {}

    def output(self, argv: list[str]) -> str:
        key = tuple(argv)
        if key not in self.cache:
            self.cache[key] = self._run(argv)
        return self.cache[key]

    def _run(self, argv: list[str]) -> str:
        from click.testing import CliRunner

        from simulator.cli import main

        runner = CliRunner(env={"MEMWALL_CONFIG_DIR": None, "COLUMNS": "100"})
        before = Path.cwd()
        os.chdir(self.cwd)
        try:
            result = runner.invoke(main, argv, prog_name="simulate")
        finally:
            os.chdir(before)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise DocError(f"simulate {shlex.join(argv)} raised {result.exception!r}") from result.exception
        lines = [line.rstrip() for line in result.stdout.splitlines()]
        if result.exit_code != 0:
            lines += [line.rstrip() for line in result.stderr.splitlines()] + [f"(exit {result.exit_code})"]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)

    def block_output(self, block: Block, index: int | None = None) -> str:
        """The whole output (unfiltered) of a block, or of its index-th command (1-based)."""
        commands = block.commands if index is None else [block.commands[index - 1]]
        return "\n".join(self.output(command.argv) for command in commands)


def wanted(block: Block, slow: bool) -> bool:
    return slow or not block.slow


def slow_enabled() -> bool:
    return os.environ.get(SLOW_ENV, "") == "slow"


def resolve(ref: str, blocks: dict[str, Block], where: str) -> tuple[Block, int | None]:
    name, _, index = ref.partition("#")
    if name not in blocks:
        raise DocError(f"{where}: no doc:run block with id {name!r}")
    block = blocks[name]
    if index:
        if not index.isdigit() or not 1 <= int(index) <= len(block.commands):
            raise DocError(f"{where}: block {name!r} has {len(block.commands)} command(s); {ref!r} names none of them")
        return block, int(index)
    return block, None


def extract(figure: Figure, output: str) -> str:
    match = re.search(figure.pattern, output, flags=re.MULTILINE)
    if match is None:
        raise DocError(f"{figure.doc}:{figure.line}: figure /{figure.pattern}/ of {figure.ref} matches nothing in its output")
    return match.group(1) if match.re.groups else match.group(0)


@dataclass
class Failure:
    doc: str
    line: int
    block: str
    command: str
    message: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: block {self.block!r}, command `{self.command}`:\n{self.message}"


def check_block(block: Block, runner: Runner) -> list[Failure]:
    failures = []
    for command in block.commands:
        actual = block.select(runner.output(command.argv))
        if actual != command.expected:
            diff = difflib.unified_diff(command.expected, actual, "in the doc", "printed now", lineterm="", n=1)
            failures.append(Failure(block.doc, block.line, block.id, command.shown, "\n".join(diff)))
    return failures


def check_marks(doc: Doc, blocks: dict[str, Block], runner: Runner, slow: bool,
                only: str | None = None) -> list[Failure]:
    """Figures and expectations of a doc (only those on block ``only`` when given)."""
    failures = []
    for figure in doc.figures:
        block, index = resolve(figure.ref, blocks, f"{figure.doc}:{figure.line}")
        if (only is not None and block.id != only) or not wanted(block, slow):
            continue
        value = extract(figure, runner.block_output(block, index))
        if value != figure.value:
            shown = block.commands[index - 1].shown if index else "; ".join(c.shown for c in block.commands)
            failures.append(Failure(figure.doc, figure.line, block.id, shown,
                                    f"figure /{figure.pattern}/: the doc says {figure.value!r}, the program prints {value!r}"))
    for expect in doc.expects:
        block, index = resolve(expect.ref, blocks, f"{expect.doc}:{expect.line}")
        if (only is not None and block.id != only) or not wanted(block, slow):
            continue
        found = re.search(expect.pattern, runner.block_output(block, index), flags=re.MULTILINE) is not None
        if found == expect.negated:
            shown = block.commands[index - 1].shown if index else "; ".join(c.shown for c in block.commands)
            verb = "matches" if expect.negated else "no longer matches"
            failures.append(Failure(expect.doc, expect.line, block.id, shown,
                                    f"the conclusion /{expect.pattern}/ {verb} the output: rewrite the prose by hand"))
    for compare in doc.compares:
        where = f"{compare.doc}:{compare.line}"
        (block1, index1), (block2, index2) = resolve(compare.ref1, blocks, where), resolve(compare.ref2, blocks, where)
        if (only is not None and only not in {block1.id, block2.id}) or not (wanted(block1, slow) and wanted(block2, slow)):
            continue
        left = extract(Figure(compare.doc, compare.line, compare.ref1, compare.re1, ""), runner.block_output(block1, index1))
        right = extract(Figure(compare.doc, compare.line, compare.ref2, compare.re2, ""), runner.block_output(block2, index2))
        a, b = number(left, where), number(right, where)
        if not OPERATORS[compare.op](a, b):
            failures.append(Failure(compare.doc, compare.line, block1.id, f"{compare.ref1} vs {compare.ref2}",
                                    f"the conclusion {left} {compare.op} {right} no longer holds: rewrite the prose by hand"))
    return failures


OPERATORS = {"<": float.__lt__, ">": float.__gt__, "<=": float.__le__, ">=": float.__ge__}
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "": 1.0}


def number(text: str, where: str) -> float:
    """A printed figure as a number: '1,234.5', '42.23 ms' (times compare across units)."""
    match = re.fullmatch(r"\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*(\S*?)x?\s*", text)
    if match is None:
        raise DocError(f"{where}: {text!r} is not a number")
    unit = match.group(2)
    return float(match.group(1).replace(",", "")) * UNITS.get(unit, 1.0)


def all_blocks(docs: list[Doc]) -> dict[str, Block]:
    return {block.id: block for doc in docs for block in doc.blocks}


def check(docs: list[Doc], runner: Runner, slow: bool) -> list[Failure]:
    blocks = all_blocks(docs)
    failures: list[Failure] = []
    for doc in docs:
        for block in doc.blocks:
            if wanted(block, slow):
                failures += check_block(block, runner)
        failures += check_marks(doc, blocks, runner, slow)
    return failures


def regenerated_text(doc: Doc, blocks: dict[str, Block], runner: Runner, slow: bool) -> str:
    """The doc with every (wanted) block's output and every figure rewritten from the program."""
    lines = list(doc.lines)
    for block in sorted(doc.blocks, key=lambda b: b.start, reverse=True):
        if not wanted(block, slow):
            continue
        body: list[str] = []
        for command in block.commands:
            body += command.text + block.select(runner.output(command.argv))
        lines[block.start:block.stop] = body
    out = []
    fence: str | None = None  # figures quoted in ordinary code blocks are examples: left alone
    for line in lines:
        if fence is not None or line.startswith("```"):
            if fence is None:
                fence = line[: len(line) - len(line.lstrip("`"))]
            elif line.strip() == fence:
                fence = None
            out.append(line)
            continue

        def replace(match: re.Match[str], line: str = line) -> str:
            figure = Figure(doc.name, 0, match["ref"], match["pattern"], match["value"])
            block, index = resolve(figure.ref, blocks, f"{doc.name}: {line.strip()[:80]}")
            if not wanted(block, slow):
                return match.group(0)
            value = extract(figure, runner.block_output(block, index))
            return f"<!-- doc:fig {figure.ref} /{figure.pattern}/ -->{value}<!-- /doc:fig -->"
        parts = line.split("`")
        out.append("`".join(FIG_RE.sub(replace, part) if k % 2 == 0 else part for k, part in enumerate(parts)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.regenerate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report differences, write nothing (exit 1 if any)")
    parser.add_argument("--fast", action="store_true", help="skip blocks marked slow (simulate validate)")
    parser.add_argument("docs", nargs="*", type=Path, help="docs to process (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    paths = [path.resolve() for path in args.docs] or doc_paths()
    slow = not args.fast
    try:
        docs = parse_all(doc_paths())  # every block, so figures may quote a block of another doc
        chosen = [doc for doc in docs if doc.path in paths]
        blocks = all_blocks(docs)
        with scratch_folder() as folder:
            runner = Runner(folder)
            if args.check:
                failures = check(chosen, runner, slow)
                for failure in failures:
                    print(failure, end="\n\n")
                print(f"{len(failures)} difference(s)" if failures else "docs match the program")
                return 1 if failures else 0
            for doc in chosen:
                moved = [block.id for block in doc.blocks if wanted(block, slow) and check_block(block, runner)]
                figures = [f for f in check_marks(doc, blocks, runner, slow) if f.message.startswith("figure")]
                new = regenerated_text(doc, blocks, runner, slow)
                if new != "\n".join(doc.lines):
                    doc.path.write_text(new, encoding="utf-8")
                    print(f"{doc.name}: rewrote the output of block(s) {', '.join(moved) or '-'}; "
                          f"{len(figures)} figure(s) changed")
                    for failure in figures:
                        print(f"  line {failure.line} ({failure.block}): {failure.message}")
            # Conclusions are never rewritten: report the ones the new output contradicts.
            fresh = parse_all(doc_paths())
            fresh_blocks = all_blocks(fresh)
            left = [f for doc in fresh if doc.path in paths for f in check_marks(doc, fresh_blocks, runner, slow)]
            for failure in left:
                print(failure, end="\n\n")
            if left:
                print(f"{len(left)} conclusion(s) no longer hold: rewrite the prose by hand")
                return 1
    except DocError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs' worked examples match what the program prints (docs/README.md has the format).

Every ``doc:run`` block of README.md and docs/*.md is run and its output compared line by line;
every ``doc:fig`` figure, ``doc:expect`` and ``doc:compare`` conclusion is checked against the
output of the block it names. Blocks marked ``slow`` run only with MEMWALL_DOCS=slow. After a change
that moves figures, ``python -m docs.regenerate`` rewrites the outputs and figures; a conclusion
that flips still fails here until the prose is rewritten by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` run without `python -m`: docs/ is a folder of the checkout
    sys.path.insert(0, str(ROOT))

from docs.regenerate import (  # noqa: E402
    Block,
    DocError,
    Runner,
    all_blocks,
    check,
    check_block,
    check_marks,
    parse,
    parse_all,
    regenerated_text,
    resolve,
    scratch_folder,
    slow_enabled,
)

DOCS = parse_all()
BLOCKS = all_blocks(DOCS)


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    with scratch_folder() as folder:
        yield Runner(folder)


@pytest.mark.parametrize("block", [b for d in DOCS for b in d.blocks], ids=lambda b: f"{b.doc}::{b.id}")
def test_doc_block_matches_the_program(block: Block, runner: Runner) -> None:
    if block.slow and not slow_enabled():
        pytest.skip("slow block: set MEMWALL_DOCS=slow to check it")
    failures = check_block(block, runner)
    for doc in DOCS:  # the figures and conclusions that quote this block, in any doc
        failures += check_marks(doc, BLOCKS, runner, slow=slow_enabled(), only=block.id)
    assert not failures, "docs drifted from the program (python -m docs.regenerate rewrites outputs and figures):\n\n" + "\n\n".join(
        str(f) for f in failures
    )


def test_every_marker_names_a_block_and_the_docs_keep_their_examples() -> None:
    for doc in DOCS:
        for mark in doc.figures + doc.expects:
            resolve(mark.ref, BLOCKS, f"{mark.doc}:{mark.line}")
        for compare in doc.compares:
            resolve(compare.ref1, BLOCKS, f"{compare.doc}:{compare.line}")
            resolve(compare.ref2, BLOCKS, f"{compare.doc}:{compare.line}")
    # The examples issue 36 found drifted stay under the check (a block deleted would hide them).
    for name in ("card", "effects-flash-naive-prefill", "effects-quantisation", "spec-eagle-b256",
                 "disagg-ratio-sweep", "deploy-admission"):
        assert name in BLOCKS, name
    assert sum(len(d.figures) for d in DOCS) >= 50
    assert sum(len(d.expects) + len(d.compares) for d in DOCS) >= 10


CHEAP = "simulate layers --model llama2-7b --gpu a100 --batch 1 --ctx 256 --gen 64"


def _write(tmp_path: Path, step: str, figure: str, conclusion: str) -> Path:
    doc = tmp_path / "planted.md"
    doc.write_text(
        "# planted\n\n"
        '<!-- doc:run id=planted grep="^step time" -->\n'
        "```text\n"
        f"$ {CHEAP}\n"
        f"{step}\n"
        "```\n"
        "<!-- doc:end -->\n\n"
        f"A decode step takes <!-- doc:fig planted /step time ([0-9.]+ ms)/ -->{figure}<!-- /doc:fig -->,\n"
        f"with <!-- doc:expect planted /{conclusion}/ --> no communication.\n",
        encoding="utf-8",
    )
    return doc


def test_checker_fails_on_planted_drift_and_passes_on_the_truth(tmp_path: Path, runner: Runner) -> None:
    true_line = [line for line in runner.output(CHEAP.split()[1:]).splitlines() if line.startswith("step time")][0]
    true_ms = true_line.split()[2] + " ms"
    assert true_line.startswith(f"step time {true_ms},")

    good = parse(_write(tmp_path, true_line, true_ms, "communication 0 s"))
    assert check([good], runner, slow=False) == []

    wrong_line = true_line.replace(true_ms, "99.99 ms")
    bad = parse(_write(tmp_path, wrong_line, "99.99 ms", "communication 5 s"))
    failures = check([bad], runner, slow=False)
    assert len(failures) == 3
    block_failure, figure_failure, conclusion_failure = failures
    text = str(block_failure)
    # Readable: the doc, the block id, the command, and a diff of the two lines.
    assert "planted.md:3: block 'planted'" in text and CHEAP in text
    assert f"-{wrong_line}" in text and f"+{true_line}" in text
    assert f"the doc says '99.99 ms', the program prints '{true_ms}'" in str(figure_failure)
    assert "communication 5 s/ no longer matches" in str(conclusion_failure)

    # The regenerator rewrites the output and the figure, never the conclusion.
    fixed_path = tmp_path / "planted.md"
    fixed_path.write_text(regenerated_text(bad, all_blocks([bad]), runner, slow=False), encoding="utf-8")
    fixed = parse(fixed_path)
    assert fixed.blocks[0].commands[0].expected == [true_line]
    assert fixed.figures[0].value == true_ms
    left = check([fixed], runner, slow=False)
    assert [f.message for f in left] == ["the conclusion /communication 5 s/ no longer matches the output: rewrite the prose by hand"]


def test_compare_markers_check_the_relation(tmp_path: Path, runner: Runner) -> None:
    doc = tmp_path / "compare.md"
    body = (
        '<!-- doc:run id=small grep="^step time" -->\n```text\n$ {c1}\n```\n<!-- doc:end -->\n'
        '<!-- doc:run id=big grep="^step time" -->\n```text\n$ {c2}\n```\n<!-- doc:end -->\n'
        "<!-- doc:compare small /step time ([0-9.]+ ms)/ {op} big /step time ([0-9.]+ ms)/ -->\n"
    )
    c1, c2 = CHEAP, CHEAP.replace("--batch 1", "--batch 256")
    for op, holds in (("<", True), (">", False)):
        doc.write_text(body.format(c1=c1, c2=c2, op=op), encoding="utf-8")
        parsed = parse(doc)
        failures = check_marks(parsed, all_blocks([parsed]), runner, slow=False)
        assert (failures == []) is holds, failures


def test_malformed_markers_are_errors_naming_the_line(tmp_path: Path) -> None:
    doc = tmp_path / "bad.md"
    doc.write_text("text\n<!-- doc:run grep=x -->\n```\n$ simulate models\n```\n<!-- doc:end -->\n", encoding="utf-8")
    with pytest.raises(DocError, match=r"bad.md:2: a doc:run marker needs id=NAME"):
        parse(doc)
    doc.write_text("<!-- doc:run id=a -->\n```\n$ ls -l\n```\n<!-- doc:end -->\n", encoding="utf-8")
    with pytest.raises(DocError, match="not a simulate command"):
        parse(doc)
    doc.write_text("<!-- doc:run id=a -->\n```\n$ simulate models\n```\n", encoding="utf-8")
    with pytest.raises(DocError, match=r"must end with its fence and then <!-- doc:end -->"):
        parse(doc)

"""The code and the docs cite only what the repository holds.

A docstring or comment that sends a reader to a file outside the repository (a design note,
a style guide, a path on someone's machine) is a dead end for everyone else: what the reader
needs is written in the docstring itself or in docs/. Links between the repository's own
markdown files must resolve, so must the docs/ files the code, the tests, the benchmarks and
the recipes cite, and every `digenrl` command the docs show must parse. The generated
reference pages (docs/reference/config.md, cli.md) must be what their generator writes now.
"""

import re
from pathlib import Path

import pytest

from digenrl.tools import reference
from tests.helpers.doc_commands import CommandError, check_command, digenrl_commands

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"DESIGN\.md|DESIGN:|HOUSE_STYLE|/work/|briefs/")


def test_no_citation_of_a_file_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted([*(ROOT / "digenrl").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
             for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "cites a file outside the repository (carry what it says here instead):\n" + "\n".join(found)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_markdown_links_between_the_docs_resolve():
    broken = []
    for p in _markdown_files():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", p.read_text()):
            if "://" not in target and not (p.parent / target).exists():
                broken.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# A docs path as the code cites it: docs/<page>.md, or a page in one of docs/'s trees. Other
# repositories' docs cited by file and line (veRL-Omni's docs/algo/..., prefixed by its
# checkout) are not ours to check.
DOC_CITATION = re.compile(r"(?<![\w/.:{}-])docs/(?:[\w-]+|(?:guides|reference|design|measurements)/[\w./-]+)\.md")


def _citing_files() -> list[Path]:
    return sorted({*(ROOT / "digenrl").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
                   *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "recipes").glob("*.yaml"),
                   *(p for p in (ROOT / "deploy").rglob("*") if p.is_file()), *(ROOT / ".ci").glob("*")})


def test_docs_cited_from_code_tests_and_recipes_exist():
    missing = [f"{p.relative_to(ROOT)}:{i}: {cited}"
               for p in _citing_files() if p.is_file()
               for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
               for cited in DOC_CITATION.findall(line) if not (ROOT / cited).exists()]
    assert not missing, "cites a docs/ file that does not exist (it moved? say where it went):\n" + "\n".join(missing)


def test_generated_reference_pages_are_current():
    stale = reference.stale()
    assert not stale, (f"stale: {', '.join(stale)} differ from what the schema and the parsers give now; "
                       f"regenerate with `{reference.COMMAND}` and commit the result")


DOC_COMMANDS = [(p.relative_to(ROOT).as_posix(), argv) for p in sorted((ROOT / "docs").rglob("*.md"))
                for argv in digenrl_commands(p.read_text())]


def test_the_docs_show_commands():
    assert len(DOC_COMMANDS) > 10


@pytest.mark.parametrize("page, argv", DOC_COMMANDS, ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_every_command_in_the_docs_parses(page, argv):
    """As tests/test_readme.py does for the README: every `digenrl ...` of a ```bash block in
    docs/ parses (a `train` command's config validates too). A block that only illustrates
    (placeholders, a transcript) is written as ```text instead."""
    try:
        skipped = check_command(argv)
    except CommandError as e:
        pytest.fail(f"{page}: `digenrl {' '.join(argv)}`: {e}")
    if skipped:
        pytest.skip(skipped)

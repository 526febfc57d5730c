"""The code and the docs cite only what the repository holds.

A docstring or comment that sends a reader to a file outside the repository (a design note,
a style guide, a path on someone's machine) is a dead end for everyone else: what the reader
needs is written in the docstring itself or in docs/. Links between the repository's own
markdown files must resolve.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"DESIGN\.md|DESIGN:|HOUSE_STYLE|/work/|briefs/")


def test_no_citation_of_a_file_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted([*(ROOT / "digenrl").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
             for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "cites a file outside the repository (carry what it says here instead):\n" + "\n".join(found)


def test_markdown_links_between_the_docs_resolve():
    broken = []
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", p.read_text()):
            if "://" not in target and not (p.parent / target).exists():
                broken.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)

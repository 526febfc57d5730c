"""The README's commands are ones the CLI accepts: every `digenrl train` line parses and its
config (file + overrides) validates; every other subcommand it shows exists and parses.

Running them is the closing notes' and the benchmarks' job (most need minutes, a GPU or
model weights); this catches a README that names a key, a flag or a file that is gone.
"""

import re
import shlex
from pathlib import Path

import pytest

from digenrl.tools.cli import DELEGATED, build_parser, train_parser
from digenrl.config.schema import load_config
from tests.helpers.doc_commands import PLACEHOLDER, digenrl_commands, known_subcommands

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    return digenrl_commands((ROOT / "README.md").read_text())


COMMANDS = readme_commands()


def test_the_readme_shows_commands():
    assert [c[0] for c in COMMANDS].count("train") >= 3 and {"simulate", "plan", "profile"} <= {c[0] for c in COMMANDS}


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "train"], ids=lambda a: " ".join(a)[:60])
def test_train_commands_parse_and_validate(argv):
    args = train_parser().parse_intermixed_args(argv[1:])
    if args.config and PLACEHOLDER.search(args.config):
        pytest.skip(f"{args.config} is the reader's own file")
    overrides = list(args.overrides) + ([f"train.steps={args.steps}"] if args.steps else [])
    load_config(ROOT / args.config if args.config else None, overrides)


def test_every_subcommand_shown_exists():
    assert {c[0] for c in COMMANDS} <= known_subcommands()


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] not in ("train", *(n for n, *_ in DELEGATED))],
                         ids=lambda a: " ".join(a)[:60])
def test_other_built_in_commands_parse(argv):
    build_parser().parse_args(argv)


def _pytest_parts(lines) -> list[list[str]]:
    """Every `pytest ...` (or `python3 -m pytest ...`) in `lines`, split like a shell."""
    out = []
    for line in lines:
        for part in line.split("#")[0].split("&&"):
            argv = shlex.split(part)
            if argv[:3] == ["python3", "-m", "pytest"]:
                argv = argv[2:]
            if argv[:1] == ["pytest"]:
                out.append(argv)
    return out


def test_ci_runs_the_readmes_test_commands():
    """`.ci/run` runs the README's test commands: the quick one (`pytest`), then the rest of the
    full one, in that order, and nothing else."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [_pytest_parts(b.replace("\\\n", " ").splitlines()) for b in blocks]
    commands = [c for c in commands if c]
    quick, full = commands[0], max(commands, key=len)
    assert quick == [["pytest"]] and full[0] == ["pytest"] and len(full) > 1
    assert _pytest_parts((ROOT / ".ci" / "run").read_text().splitlines()) == full

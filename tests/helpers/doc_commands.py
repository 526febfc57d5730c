"""The `digenrl` commands a markdown file shows in its ```bash blocks, and the check that one
parses with the command line's own parsers (tests/test_readme.py for the README,
tests/test_docs_references.py for docs/)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from digenrl.config.schema import ConfigError, load_config
from digenrl.tools.cli import DELEGATED, build_parser, train_parser
from digenrl.tools.reference import delegated_parser

ROOT = Path(__file__).resolve().parents[2]
# configs that are the reader's own file, not one in the repository
PLACEHOLDER = re.compile(r"/path/to/|my\.yaml|my_cluster\.yaml|HEAD:6379|plan\.yaml")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```bash blocks of a markdown text, continuation lines joined."""
    return [block.replace("\\\n", " ") for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def digenrl_commands(text: str) -> list[list[str]]:
    """Every `digenrl ...` command of the text's ```bash blocks, as its argv after `digenrl`:
    each line, each `&&`-joined part, comments and leading VAR=value assignments dropped."""
    out = []
    for block in bash_blocks(text):
        for line in block.splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                while argv and ENV_ASSIGNMENT.match(argv[0]):
                    argv = argv[1:]
                if argv[:1] == ["digenrl"] and len(argv) > 1:
                    out.append(argv[1:])
    return out


def known_subcommands() -> set[str]:
    sub = build_parser()._subparsers._group_actions[0].choices
    return {name for name, *_ in DELEGATED} | set(sub)


class CommandError(Exception):
    """A command the parsers refuse (argparse's message is on stderr)."""


def check_command(argv: list[str]) -> str | None:
    """Parse `digenrl <argv>` as the CLI would; for `train`, also validate its config (file +
    overrides). Returns why it was skipped (a config that is the reader's own file), else None;
    raises CommandError when a parser or the config refuses it."""
    name, rest = argv[0], argv[1:]
    if name not in known_subcommands():
        raise CommandError(f"no subcommand {name!r}")
    try:
        if name == "train":
            args = train_parser().parse_intermixed_args(rest)
            if args.config and PLACEHOLDER.search(args.config):
                return f"{args.config} is the reader's own file"
            overrides = list(args.overrides) + ([f"train.steps={args.steps}"] if args.steps else [])
            load_config(ROOT / args.config if args.config else None, overrides)
        elif name in {n for n, *_ in DELEGATED}:
            delegated_parser(name).parse_args(rest)
        else:
            build_parser().parse_args(argv)
    except SystemExit as e:  # argparse refused it
        raise CommandError(f"the parser refused it (exit {e.code})") from None
    except ConfigError as e:
        raise CommandError(f"its config is refused: {e}") from None
    return None

"""The schema as `digenrl train --help-config` prints it: every key with its type, default and
description (config_keys, config_help).

A field's description is the comment written where it is declared: the comment lines
directly above it, then the comment at the end of its line (as simple-parsing reads help); a
"-- group --" heading line is not part of it.
The code stays the one place a key is described; tests/test_config_schema.py fails on a
field without one.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, fields
from typing import Any, Optional

import yaml

from digenrl.config.schema import Config


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, e.g. "runtime.rollout.workers"
    type: str  # e.g. "int", "str or null", "dict[str, float]"
    default: Any  # Config()'s value (a pool's default is its own: runtime.rollout.workers = 2)
    description: str


def _field_comments(cls: type) -> dict[str, str]:
    """{field name: the comment written where `cls` declares it}."""
    import ast
    import inspect
    import io
    import tokenize

    source = inspect.getsource(cls)
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, the line holds only the comment)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            trailing = comments.get(node.end_lineno)
            text = above + ([trailing[0]] if trailing and not trailing[1] else [])
            # a "-- group --" line heads a group of fields: it describes none of them alone
            out[node.target.id] = " ".join(t for t in text if t and not (t.startswith("--") and t.endswith("--")))
    return out


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def config_keys(cfg: Optional[Config] = None) -> list[KeyDoc]:
    """Every key of the schema with its type, default (`cfg`'s value; Config() if None) and
    description, in declaration order, a section's own keys before its subsections."""

    def walk(obj: Any, prefix: str) -> list[KeyDoc]:
        cls = type(obj)
        hints, notes, rows, sections = typing.get_type_hints(cls), _field_comments(cls), [], []
        for f in fields(cls):  # a section's own keys first, then its subsections
            value, key = getattr(obj, f.name), f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                sections += walk(value, key + ".")
            else:
                rows.append(KeyDoc(key, _type_name(hints[f.name]), value, notes.get(f.name, "")))
        return rows + sections

    return walk(cfg if cfg is not None else Config(), "")


def config_help(width: int = 100) -> str:
    """The text of `digenrl train --help-config`: every section with what it is for, then each
    of its keys as `key: type = default` and its description, wrapped."""
    import textwrap

    def value(v: Any) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()

    purpose = {}  # section -> its class docstring's first paragraph + the comment where it is declared
    for name, obj in _sections(Config()):
        notes = _field_comments(type(obj))
        for f in fields(obj):
            cls = type(getattr(obj, f.name))
            if dataclasses.is_dataclass(cls):
                doc = (cls.__doc__ or "").strip()
                doc = "" if doc.startswith(cls.__name__ + "(") else doc.split("\n\n")[0].replace("\n", " ")
                purpose[f"{name}.{f.name}".lstrip(".")] = " ".join(t for t in (doc, notes.get(f.name, "")) if t)
    lines, section = [], None
    for doc in config_keys():
        head = doc.key.rpartition(".")[0]
        if head != section:
            section = head
            lines += ["", f"{head}:"] + textwrap.wrap(purpose.get(head, ""), width, initial_indent="  ", subsequent_indent="  ")
        lines.append(f"  {doc.key}: {doc.type} = {value(doc.default)}")
        lines += textwrap.wrap(doc.description, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines[1:]) + "\n"


def _sections(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, dataclass instance) of every section of `obj`, itself included ("")."""
    out = [(prefix.rstrip("."), obj)]
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _sections(value, f"{prefix}{f.name}.")
    return out


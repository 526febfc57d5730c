"""Import layering (HOUSE_STYLE habit 1: the dependency direction is the architecture).

Every module under digenrl/ is parsed with `ast`; every import counts, wherever it sits
(module top, inside a function, under `if TYPE_CHECKING:`), and so does
`importlib.import_module("...")` / `__import__("...")` with a literal name. Rules:

    ray                only under digenrl/runtime/
    sched              no torch, ray, time, datetime: decisions come from events, not clocks
    sim/engine, trace  the same (the simulator's virtual clock and the trace it records)
    emulated runtime   no torch in runtime/emulated.py, nor in any module that defines an
                       Emulated* worker class: emulated workers sleep, they compute nothing
    math               torch, the standard library and digenrl.math only
    models / toy       models never imports toy (toy may import models: the toy world
                       pretrains the tiny DiT; the tiny DiT owns its tokenizer and files)
    runtime            never imports the simulator's reports: digenrl.sim.report,
                       digenrl.sim.simulate, digenrl.sim.planner

A failure names the module, the line and the rule.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "digenrl"


@dataclass(frozen=True)
class Import:
    line: int
    names: tuple[str, ...]  # dotted names this statement may bind: `from a import b` -> (a, a.b)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in `source` (the text of `module`), relative ones made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, (a.name,)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from .x import y, from .. import z
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append(Import(node.lineno, (base, *(f"{base}.{a.name}" for a in node.names if a.name != "*"))))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append(Import(node.lineno, (node.args[0].value,)))
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def banned(*prefixes: str) -> Callable[[Import], Optional[str]]:
    def check(imp: Import) -> Optional[str]:
        return next((n for n in imp.names for p in prefixes if _within(n, p)), None)
    return check


def only(*prefixes: str, stdlib: bool = False) -> Callable[[Import], Optional[str]]:
    def check(imp: Import) -> Optional[str]:
        ok = any(_within(n, p) for n in imp.names for p in prefixes)
        ok = ok or (stdlib and imp.names[0].split(".")[0] in sys.stdlib_module_names)
        return None if ok else imp.names[-1]
    return check


@dataclass(frozen=True)
class Rule:
    name: str
    text: str
    applies: Callable[[str, str], bool]  # (module name, source) -> the rule covers this module
    violation: Callable[[Import], Optional[str]]  # the offending name, or None


def _in(*packages: str) -> Callable[[str, str], bool]:
    return lambda module, source: any(_within(module, p) for p in packages)


def _defines_emulated_worker(module: str, source: str) -> bool:
    return _within(module, "digenrl.runtime") and any(
        isinstance(n, ast.ClassDef) and n.name.startswith("Emulated") and n.name.endswith("Worker")
        for n in ast.walk(ast.parse(source)))


RULES = [
    Rule("ray-only-in-runtime", "ray is imported only under digenrl/runtime/",
         lambda module, source: not _within(module, "digenrl.runtime"), banned("ray")),
    Rule("sched-pure", "digenrl/sched/ imports no torch, ray, time or datetime",
         _in("digenrl.sched"), banned("torch", "ray", "time", "datetime")),
    Rule("engine-and-trace-pure", "the simulator's engine and the trace import no torch, ray, time or datetime",
         _in("digenrl.sim.engine", "digenrl.trace"), banned("torch", "ray", "time", "datetime")),
    Rule("emulated-no-torch", "the emulated runtime imports no torch (runtime/emulated.py and the module of any Emulated*Worker)",
         lambda module, source: module == "digenrl.runtime.emulated" or _defines_emulated_worker(module, source),
         banned("torch")),
    Rule("math-pure", "digenrl/math/ imports only torch, the standard library and digenrl.math",
         _in("digenrl.math"), only("torch", "digenrl.math", stdlib=True)),
    Rule("models-not-toy", "digenrl/models/ never imports digenrl.toy (toy may import models, not the reverse)",
         _in("digenrl.models"), banned("digenrl.toy")),
    Rule("runtime-no-sim-reports", "digenrl/runtime/ does not import the simulator's reports (sim.report, sim.simulate, sim.planner)",
         _in("digenrl.runtime"), banned("digenrl.sim.report", "digenrl.sim.simulate", "digenrl.sim.planner")),
]

MODULES = sorted(PACKAGE.rglob("*.py"))


def violations(rule: Rule) -> tuple[list[str], int]:
    """(messages, modules the rule covered)."""
    messages, covered = [], 0
    for path in MODULES:
        source, module = path.read_text(), module_name(path)
        if not rule.applies(module, source):
            continue
        covered += 1
        for imp in imports_of(source, module, path.name == "__init__.py"):
            name = rule.violation(imp)
            if name is not None:
                messages.append(f"{path.relative_to(ROOT)}:{imp.line}: imports {name}; rule {rule.name}: {rule.text}")
    return messages, covered


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_layering(rule):
    messages, covered = violations(rule)
    assert covered, f"rule covers no module (moved or renamed?): {rule.text}"
    assert not messages, "\n".join(messages)


# -- the checker itself ---------------------------------------------------------------------
SAMPLE = '''
import os, torch.nn as nn
from typing import TYPE_CHECKING
from . import sibling
from ..toy.world import VOCAB
if TYPE_CHECKING:
    from digenrl import toy
def f():
    import ray
    class C:
        def g(self):
            from datetime import datetime
    return importlib.import_module("digenrl.sim.report"), __import__("time")
'''


def test_checker_finds_imports_anywhere_with_their_lines():
    found = {n: imp.line for imp in imports_of(SAMPLE, "digenrl.models.tiny_dit") for n in imp.names}
    assert found["os"] == 2 and found["torch.nn"] == 2
    assert found["digenrl.models.sibling"] == 4  # relative, from a module
    assert found["digenrl.toy.world"] == 5 and found["digenrl.toy.world.VOCAB"] == 5
    assert found["digenrl.toy"] == 7  # under TYPE_CHECKING
    assert found["ray"] == 9 and found["datetime"] == 12  # inside a function, inside a method
    assert found["digenrl.sim.report"] == 13 and found["time"] == 13  # by name
    # in a package's __init__, '.' is the package itself
    assert "digenrl.models.lora" in {n for i in imports_of("from .lora import x", "digenrl.models", True)
                                     for n in i.names}


def test_rules_catch_what_they_forbid():
    def hits(rule_index: int, source: str, module: str) -> list[str]:
        rule = RULES[rule_index]
        return [n for imp in imports_of(source, module) if (n := rule.violation(imp))]

    assert hits(0, "def f():\n    import ray", "digenrl.trainer") == ["ray"]
    assert hits(0, "from ray import serve", "digenrl.rewards.client") == ["ray"]
    assert RULES[0].applies("digenrl.rewards.batching", "") and not RULES[0].applies("digenrl.runtime.serving.reward_app", "")
    assert hits(1, "from time import monotonic", "digenrl.sched.scheduler") == ["time"]
    assert hits(4, "import numpy", "digenrl.math.sde") == ["numpy"]
    assert hits(4, "import math, typing\nfrom digenrl.math import sde\nimport torch.nn", "digenrl.math.loss") == []
    assert hits(4, "from digenrl import models", "digenrl.math.loss") == ["digenrl.models"]
    assert hits(5, "from digenrl import toy", "digenrl.models.tiny_dit") == ["digenrl.toy"]
    assert hits(5, "from digenrl.toy.world import VOCAB", "digenrl.models.tiny_dit") == ["digenrl.toy.world"]
    assert hits(6, "from digenrl.sim.testbed import load_testbed", "digenrl.runtime.bench") == []
    assert _defines_emulated_worker("digenrl.runtime.fake", "class EmulatedWorker:\n    pass")

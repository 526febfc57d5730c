"""Import layering: the dependency direction is the architecture.

Every module under digenrl/ is parsed with `ast`; every import counts, wherever it sits
(module top, inside a function, under `if TYPE_CHECKING:`), and so does
`importlib.import_module("...")` / `__import__("...")` with a literal name.

The order. The top-level parts of the package (digenrl/<part>/ or digenrl/<part>.py) stand
in LAYERS, lowest first; a part imports only itself and parts of lower layers, so no two
parts need each other. Inside a part, no modules import each other in a cycle either
(`test_no_module_cycles`). A new part fails `test_every_part_has_a_layer` until it is placed.

Point rules on top of the order:

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
from typing import Callable, Iterable, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "digenrl"

# Lowest first. A part may import the parts of any layer below its own, never one of its own
# layer or above (the layer is the reason: math is pure torch; models and the single-device
# pieces build on it; the config names their choices; io, training and the simulator use the
# config; the runtime runs all of it on Ray; tools drive everything).
LAYERS = [
    ("math", "sched", "prompt_sets"),  # pure: torch or nothing; the scheduler; prompt lists
    ("models",),  # policies behind one protocol
    ("rollout", "toy"),  # single-device sampling; the toy world and the tiny DiT's pretraining
    ("learner", "data", "rewards"),  # loss and optimizer; prompt sources; rewards (toy-geneval, models)
    ("config",),  # the run's schema, and the contract: Config -> scheduler + pools
    ("io",),  # what a run writes and reads back: checkpoints, recorder, trace, outputs, loggers, runs
    ("train",),  # the single-device loop (run.mode=local), the reference; held-out evaluation
    ("sim",),  # cost model, virtual clock, planner over the same scheduler
    ("profile",),  # measure this machine
    ("runtime",),  # the only Ray importer
    ("tools",),  # commands: cli, bench, posthoc, preflight
]


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
         _in("digenrl.sim.engine", "digenrl.io.trace"), banned("torch", "ray", "time", "datetime")),
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


# -- the order of the parts and the cycles ------------------------------------------------
def part_of(module: str) -> str:
    """digenrl.sim.report -> sim; digenrl.config.schema -> config ('' for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of() -> dict[str, int]:
    return {part: i for i, layer in enumerate(LAYERS) for part in layer}


def module_graph() -> dict[str, dict[str, int]]:
    """module -> {digenrl module it imports: line}, resolved to the longest module name that
    exists (`from digenrl.config.schema import Config` -> digenrl.config.schema). As the cycle tool counts:
    a package's __init__ importing its own submodules, and a module importing a package it
    sits in, are not edges."""
    names = {module_name(p): p for p in MODULES}
    graph = {}
    for module, path in names.items():
        edges = {}
        for imp in imports_of(path.read_text(), module, path.name == "__init__.py"):
            for name in imp.names:
                while name and name not in names:
                    name = name.rpartition(".")[0]
                if not name or name == module or (path.name == "__init__.py" and _within(name, module)) \
                        or _within(module, name):
                    continue
                edges.setdefault(name, imp.line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def order_violations(graph: dict[str, dict[str, int]], layers: dict[str, int]) -> list[str]:
    out = []
    for module, edges in graph.items():
        mine = part_of(module)
        for name, line in edges.items():
            theirs = part_of(name)
            if mine and theirs and mine != theirs and layers[theirs] >= layers[mine]:
                path = names_path(module)
                out.append(f"{path}:{line}: {mine} (layer {layers[mine]}) imports {name} "
                           f"({theirs}, layer {layers[theirs]}): a part imports only lower layers (LAYERS)")
    return out


def names_path(module: str) -> str:
    rel = Path(*module.split("."))
    return str(rel / "__init__.py") if (ROOT / rel).is_dir() else str(rel.with_suffix(".py"))


def test_every_part_has_a_layer():
    parts = {part_of(module_name(p)) for p in MODULES} - {""}
    listed = [part for layer in LAYERS for part in layer]
    assert len(listed) == len(set(listed)), f"a part stands in two layers: {listed}"
    assert not parts - set(listed), f"parts with no layer (place them in LAYERS): {sorted(parts - set(listed))}"
    assert not set(listed) - parts, f"LAYERS names parts that do not exist: {sorted(set(listed) - parts)}"


def test_parts_import_only_lower_layers():
    messages = order_violations(module_graph(), layer_of())
    assert not messages, "\n".join(messages)


def test_no_module_cycles():
    found = cycles(module_graph())
    assert not found, "import cycles among modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_cycle_and_order_checks_catch_what_they_forbid():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    layers = {"math": 0, "models": 1}
    graph = {"digenrl.math.sde": {"digenrl.models.lora": 3}, "digenrl.models.lora": {"digenrl.math": 5}}
    (message,) = order_violations(graph, layers)
    assert message.startswith("digenrl/math/sde.py:3: math (layer 0) imports digenrl.models.lora")
    same = {"digenrl.models.a": {"digenrl.models.b": 1}, "digenrl.models.b": {"digenrl.models.a": 1}}
    assert order_violations(same, layers) == [] and cycles(same) == [["digenrl.models.a", "digenrl.models.b"]]


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

    assert hits(0, "def f():\n    import ray", "digenrl.train.trainer") == ["ray"]
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

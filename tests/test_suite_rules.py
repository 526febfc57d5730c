"""Rules of the test suite itself.

Shared test code lives in helper modules (tests/helpers/, tests/models/tiny_diffusers*.py,
tests/models/adapter_checks.py, tests/learner/tiny_setup.py, ...), never in a test module: a
test module that imports another one runs that module's fixtures and module-level set-up, and
moving a test breaks others.
"""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _imports(path: Path) -> list[str]:
    """Every module `path` imports (absolute, or relative resolved against its package)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def test_no_test_module_imports_another():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:]):
                offenders.append(f"{path.relative_to(TESTS.parent)} imports {name}")
    assert not offenders, "move what they share into a helper module:\n" + "\n".join(offenders)


def _ray_inits_sized_without_address(path: Path) -> list[int]:
    """Lines of `path` that call ray.init with num_cpus or num_gpus but no address."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"):
            keys = {k.arg for k in node.keywords}
            if keys & {"num_cpus", "num_gpus"} and "address" not in keys and None not in keys:
                out.append(node.lineno)
    return out


def test_a_sized_ray_init_starts_its_own_cluster():
    # ray.init(num_cpus=...) with no address joins a cluster another process left on the machine
    # (a `ray start`, or ray.cluster_utils.Cluster in tests/runtime/test_nodes.py) and raises
    # "num_cpus and num_gpus must not be provided": the chaos tier failed so when xdist ran it
    # beside the nodes tier. address="local" always starts a cluster of its own.
    offenders = [f"{p.relative_to(TESTS.parent)}:{line}"
                 for folder in ("digenrl", "benchmarks", "tests") for p in sorted((TESTS.parent / folder).rglob("*.py"))
                 for line in _ray_inits_sized_without_address(p)]
    assert not offenders, 'pass address="local" (or the cluster\'s address):\n' + "\n".join(offenders)

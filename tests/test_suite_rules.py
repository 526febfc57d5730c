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

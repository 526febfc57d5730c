"""A package's names loaded on first use (PEP 562), for the packages whose torch code the
configuration and the simulator must not pay for (digenrl.math, digenrl.models, digenrl.learner).
Standard library only; it sits in the lowest layer so that every package may use it."""

from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, where: dict[str, str]):
    """The package's module `__getattr__`: each name in `where` is loaded from the submodule it
    names on first use, then kept on the package. Any other name raises AttributeError, so
    `from package import submodule` goes on to import the submodule."""

    def __getattr__(name: str):
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    """Tiny pipeline folders built so far by this test module, by family (adapter_checks.tiny_folder)."""
    return {}

"""The fixtures of the Envoy suite; the harness itself is harness.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import Harness


@pytest.fixture(params=["embedded", "store"])
def mode(request: pytest.FixtureRequest) -> str:
    """fusebox embedded, or with --store on a real redis-server."""
    return request.param


@pytest.fixture
def h(mode: str, tmp_path: Path) -> Any:
    harness = Harness(mode, tmp_path)
    try:
        if mode == "store":
            harness.redis()
        yield harness
    finally:
        harness.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failed test's report ends with the tails of its processes' logs."""
    outcome = yield
    report = outcome.get_result()
    harness = getattr(item, "funcargs", {}).get("h")
    if report.failed and isinstance(harness, Harness):
        report.sections.append(("process logs", harness.logs()))

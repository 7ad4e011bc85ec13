"""The fixture ``upstream``: Kubernetes' own allocator of every supported minor, running."""

from __future__ import annotations

import os

import pytest

from tests.support.upstream_allocator import MINORS, require, running


@pytest.fixture(scope="module")
def upstream():
    """``upstream(minor)``: a running upstream allocator (skipped where Go is absent, never under CI)."""
    for minor in MINORS:
        require(minor)
    yield running
    for minor in MINORS:
        if os.environ.get("VGPUCTL_ORACLE_COUNT"):
            print(f"\nupstream {minor}: {running(minor).requests} requests compared")
        running(minor).close()

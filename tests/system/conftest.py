"""Fixtures the system tests share (a test module may override them): tests/support/dra.py's ``base``
(a short temporary directory) and ``srv`` (a local API server), as in tests/dra_bridge."""

from tests.support.dra import base, srv  # noqa: F401 (fixtures)

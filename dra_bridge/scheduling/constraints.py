"""A claim's ``matchAttribute`` and ``distinctAttribute`` constraints (upstream constraint.go of
structured/internal/incubating). Unlike 1.36.x, a distinctAttribute keeps its values across all
requests in scope (kubernetes#140438; tests/oracle records the difference)."""

from __future__ import annotations

import json
from typing import Any

from dra_bridge.scheduling.requests import Choice


def constraints_ok(constraints: list[dict[str, Any]], chosen: list[Choice]) -> bool:
    """Whether the devices chosen so far satisfy the claim's constraints: upstream
    ``matchAttributeConstraint`` and ``distinctAttributeConstraint`` (constraint.go), over every
    device of the requests in scope (the whole claim when ``requests`` is empty)."""
    for c in constraints:
        reqs = set(c.get("requests") or [])
        scope = [ch for ch in chosen if not reqs or ch.request.base in reqs or ch.request.name in reqs]
        if "matchAttribute" in c:
            vals = [ch.device.attribute(c["matchAttribute"]) for ch in scope]
            if any(v is None for v in vals) or len({json.dumps(v) for v in vals}) > 1:
                return False
        if "distinctAttribute" in c:
            vals = [ch.device.attribute(c["distinctAttribute"]) for ch in scope]
            if any(v is None for v in vals):
                return False  # the scheduler: a device without the attribute never satisfies it
            keys = [json.dumps(v) for v in vals]
            if len(keys) != len(set(keys)):
                return False
    return True

"""Reading published API objects as plain dicts (as the server sends them): pure helpers shared by
the capacity report, the conformance checks and the simulated cluster."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dra_bridge.api.attributes import ATTR_PARENT_PCI_BUS_ID, ATTR_PCI_BUS_ID
from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.quantity import parse_quantity


def dev_attr(dev: dict, name: str, driver: str = DEFAULT_DRIVER) -> Any:
    """A ResourceSlice device's attribute value (plain or ``driver/``-qualified name)."""
    attrs = dev.get("attributes") or {}
    v = attrs.get(name) or attrs.get(f"{driver}/{name}")
    return next(iter(v.values())) if isinstance(v, dict) and v else None


def dev_gpu(dev: dict) -> str | None:
    """The physical GPU (PCI address) a published device belongs to."""
    return dev_attr(dev, ATTR_PARENT_PCI_BUS_ID) or dev_attr(dev, ATTR_PCI_BUS_ID)


def dev_memory(dev: dict) -> Fraction | None:
    cap = (dev.get("capacity") or {}).get("memory")
    return parse_quantity(cap["value"]) if cap else None


def devices_by_key(slices: list[dict]) -> dict[tuple[str, str, str], dict]:
    """Published devices by (driver, pool, name), each with the node its slice names as ``_node``."""
    out = {}
    for s in slices:
        spec = s["spec"]
        for d in spec.get("devices") or []:
            out[(spec["driver"], spec["pool"]["name"], d["name"])] = {**d, "_node": spec.get("nodeName")}
    return out

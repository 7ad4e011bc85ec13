"""A claim's requests as the scheduler model searches them (upstream: the ``requestData`` that
``Allocate`` gathers per request and sub-request in structured/internal/incubating/allocator_incubating.go)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_bridge.scheduling.pools import Amount, Device, quantity_value


@dataclass
class Request:
    name: str  # "req" or "req/sub"
    base: str
    device_class: str
    selectors: list[str]
    mode: str
    count: int
    capacity: dict[str, Amount]
    tolerations: list[dict[str, Any]]
    admin: bool = False  # adminAccess: may take a device in use, and holds nothing afterwards


@dataclass
class Choice:
    request: Request
    device: Device
    consumed: dict[str, Amount] | None = None


def parse_requests(claim: dict[str, Any]) -> list[list[Request]]:
    """Each claim request as its alternatives (one for exactly, several for firstAvailable, tried
    in order as upstream ``allocateOne`` does); missing ``allocationMode``/``count`` take the API
    server's defaults (ExactCount, 1)."""
    out = []
    for r in claim["spec"].get("devices", {}).get("requests", []):
        alts = []
        subs = r.get("firstAvailable")
        for sub in (subs if subs else [r.get("exactly") or r]):
            name = f"{r['name']}/{sub['name']}" if subs else r["name"]
            sels = [s["cel"]["expression"] for s in sub.get("selectors") or [] if "cel" in s]
            cap = {k: quantity_value(v) for k, v in ((sub.get("capacity") or {}).get("requests") or {}).items()}
            alts.append(Request(name=name, base=r["name"], device_class=sub["deviceClassName"], selectors=sels,
                                mode=sub.get("allocationMode") or "ExactCount", count=int(sub.get("count", 1)),
                                capacity=cap, tolerations=sub.get("tolerations") or [],
                                admin=not subs and bool(sub.get("adminAccess"))))  # sub-requests have none
        out.append(alts)
    return out

"""What an allocated claim's ``AllocationResult`` holds, as upstream ``Allocate`` builds it once
the devices are chosen (structured/internal/incubating/allocator_incubating.go: the results loop
and "Populate configs"): each result's admin access, tolerations, binding conditions and share,
and the claim's config. Kept apart from the search so that what the driver is handed matches
kube-scheduler of each minor, not only which devices it picks."""

from __future__ import annotations

import copy
import uuid as uuidlib
from typing import Any

from dra_bridge.api.quantity import format_quantity
from dra_bridge.scheduling.pools import Features
from dra_bridge.scheduling.requests import Choice


def device_result(ch: Choice, features: Features) -> dict[str, Any]:
    """One ``DeviceRequestAllocationResult`` (upstream: the ``resourceapi.DeviceRequestAllocationResult``
    literal of ``Allocate``)."""
    res: dict[str, Any] = {"request": ch.request.name, "driver": ch.device.driver,
                           "pool": ch.device.pool, "device": ch.device.name}
    if ch.request.admin:
        res["adminAccess"] = True  # holds nothing once allocated (reserve skips it)
    if features.tolerations_in_results and ch.request.tolerations:
        # ``Tolerations: internal.lookupRequest(claim).tolerations()``: the (sub-)request's own, 1.35+
        res["tolerations"] = copy.deepcopy(ch.request.tolerations)
    if ch.device.binding:  # only selectable with DRADeviceBindingConditions on (isSelectable)
        res["bindingConditions"] = list(ch.device.binding[0])
        res["bindingFailureConditions"] = list(ch.device.binding[1])
    if ch.device.multi:
        res["shareID"] = str(uuidlib.uuid4())
        res["consumedCapacity"] = {k: format_quantity(v) for k, v in (ch.consumed or {}).items()}
    return res


def configs(claim: dict[str, Any], chosen: list[Choice], classes: dict[str, dict[str, Any]],
            features: Features) -> list[dict[str, Any]]:
    """The ``devices.config`` of the claim's AllocationResult (upstream "Populate configs" of
    ``Allocate``): each class's config once, naming every request that used the class, then the
    claim's own config where it names a request or the chosen sub-request. Up to 1.36 a claim
    config is added once per request it names; 1.37 adds it once and leaves ``requests`` empty
    where a config names every request ("empty means all")."""
    picked = {ch.request.base: ch.request for ch in chosen}  # request -> the (sub-)request chosen
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    out: list[dict[str, Any]] = []
    by_class: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        req = picked.get(r["name"])
        if req is None:
            continue
        if req.device_class in by_class:
            for c in by_class[req.device_class]:
                c["requests"].append(req.name)
            continue
        added = [{"source": "FromClass", "requests": [req.name], **copy.deepcopy(c)}
                 for c in ((classes.get(req.device_class) or {}).get("spec") or {}).get("config") or []]
        by_class[req.device_class] = added
        out += added

    def names(r: dict[str, Any]) -> list[str]:
        req = picked.get(r["name"])
        return [r["name"]] + ([req.name] if req is not None and req.name != r["name"] else [])

    for c in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        named = c.get("requests") or []
        entry = {"source": "FromClaim", **copy.deepcopy(c)}
        if not named:
            out.append(entry)
            continue
        matches = sum(1 for r in requests if any(n in named for n in names(r)))
        out += [copy.deepcopy(entry) for _ in range(min(matches, 1) if features.config_once else matches)]
    if features.config_once:  # 1.37's appliesToAll
        for c in out:
            if c.get("requests") and all(any(n in c["requests"] for n in names(r)) for r in requests):
                c.pop("requests")
    return out

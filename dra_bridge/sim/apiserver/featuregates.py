"""Feature gates of the local API server: which DRA gates each Kubernetes version has, their defaults.

The table holds kube-apiserver's versioned specs (the version a stage starts at, its default, its
stage, whether the gate is locked to its default), so a version's defaults are read off it the way
``component-base/featuregate`` does: the last spec at or before the version wins. Source:
kubernetes/kubernetes ``pkg/features/kube_features.go`` (1.34, 1.35) and, from 1.36 on,
``staging/src/k8s.io/kube-scheduler/pkg/features/kube_features.go`` where the DRA gates moved;
``DRAResourcePoolStatus`` and ``DRAPartitionableDevicesType`` from the feature-gate pages of
kubernetes/website (``content/en/docs/reference/command-line-tools-reference/feature-gates/``).

Only the DRA gates are modelled; ``DynamicResourceAllocation`` is left out (off would remove the
whole resource.k8s.io API, which this server does not model). What a disabled gate drops on write
is in :mod:`.dropfields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_bridge.sim.apiserver.dropfields import Dropped, drop_disabled_fields

ALPHA, BETA, GA = "Alpha", "Beta", "GA"
SUPPORTED = ((1, 34), (1, 35), (1, 36), (1, 37))
ALL_ALPHA, ALL_BETA = "AllAlpha", "AllBeta"


@dataclass(frozen=True)
class Stage:
    since: tuple[int, int]
    default: bool
    stage: str
    locked: bool = False  # LockToDefault: setting the other value is refused


def _s(minor: int, default: bool, stage: str, locked: bool = False) -> Stage:
    return Stage((1, minor), default, stage, locked)


GATES: dict[str, tuple[Stage, ...]] = {
    "DRAAdminAccess": (_s(32, False, ALPHA), _s(34, True, BETA), _s(36, True, GA, locked=True)),
    "DRAConsumableCapacity": (_s(34, False, ALPHA), _s(36, True, BETA)),
    "DRADerivedAttributes": (_s(37, False, ALPHA),),
    "DRADeviceBindingConditions": (_s(34, False, ALPHA), _s(36, True, BETA)),
    # KEP-5963; alpha in 1.37 (issue #11, the KEP, and the 1.37 gate table)
    "DRADeviceCompatibilityGroups": (_s(37, False, ALPHA),),
    "DRADeviceTaintRules": (_s(35, False, ALPHA), _s(36, False, BETA), _s(37, True, GA)),
    "DRADeviceTaints": (_s(33, False, ALPHA), _s(36, True, BETA), _s(37, True, GA)),
    "DRAExtendedResource": (_s(34, False, ALPHA), _s(36, True, BETA), _s(37, True, GA, locked=True)),
    # beta in 1.37, on only once the minimum compatibility version is 1.37 (it is 1.36 here)
    "DRAFractionalCapacityRange": (_s(37, False, BETA),),
    "DRAListTypeAttributes": (_s(36, False, ALPHA),),
    "DRANodeAllocatableResources": (_s(36, False, ALPHA),),
    "DRAOptionalNodeOperations": (_s(37, False, ALPHA),),
    "DRAPartitionableDevices": (_s(33, False, ALPHA), _s(36, True, BETA)),
    "DRAPartitionableDevicesType": (_s(37, False, ALPHA),),
    "DRAPrioritizedList": (_s(33, False, ALPHA), _s(34, True, BETA), _s(36, True, GA),
                           _s(37, True, GA, locked=True)),
    "DRAResourceClaimDeviceStatus": (_s(32, False, ALPHA), _s(33, True, BETA), _s(37, True, GA, locked=True)),
    "DRAResourcePoolStatus": (_s(36, False, ALPHA),),
    "DRASchedulerFilterTimeout": (_s(34, True, BETA),),
    "DRAWorkloadResourceClaims": (_s(36, False, ALPHA), _s(37, False, BETA)),
}

_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # Go's strconv.ParseBool, as kube-apiserver parses
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


class FeatureGateError(ValueError):
    """A bad ``--feature-gates`` value: unknown gate, unparsable value, or a locked gate changed."""


def version_tuple(version: Any) -> tuple[int, int]:
    """``"1.35"``, ``"v1.35.2"``, ``(1, 35)`` -> ``(1, 35)``; refuses versions the server does not serve."""
    if isinstance(version, (tuple, list)):
        parts = [str(x) for x in version]
    else:
        parts = str(version).strip().lstrip("v").split(".")
    try:
        v = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        raise ValueError(f"unparseable Kubernetes version {version!r}") from None
    if v not in SUPPORTED:
        raise ValueError(f"Kubernetes {version} not supported: use 1.34 .. 1.37")
    return v


def stage_at(gate: str, version: Any) -> Stage | None:
    """The spec of ``gate`` in force at ``version`` (None: the gate does not exist yet)."""
    v = version_tuple(version)
    current = None
    for stage in GATES[gate]:
        if stage.since <= v:
            current = stage
    return current


def known(version: Any) -> list[str]:
    """The gate names ``version`` accepts, sorted."""
    return sorted(g for g in GATES if stage_at(g, version) is not None)


def defaults(version: Any) -> dict[str, bool]:
    """Every gate of ``version`` with its default, as kube-apiserver of that version has them."""
    return {g: stage.default for g in GATES if (stage := stage_at(g, version)) is not None}


def _allowed() -> str:
    return ", ".join(sorted(GATES) + [ALL_ALPHA, ALL_BETA])


def parse_gates(text: str | None) -> dict[str, bool]:
    """``"A=true,B=false"`` -> ``{"A": True, "B": False}`` (kube-apiserver's ``--feature-gates`` syntax).

    Names are checked against every version's gates here; :func:`resolve` checks them against one.
    """
    out: dict[str, bool] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise FeatureGateError(f"feature gate {item!r}: expected NAME=true|false")
        if name not in GATES and name not in (ALL_ALPHA, ALL_BETA):
            raise FeatureGateError(f"feature gate {item!r}: unknown gate {name!r}; known gates: {_allowed()}")
        if value in _TRUE:
            out[name] = True
        elif value in _FALSE:
            out[name] = False
        else:
            raise FeatureGateError(f"feature gate {item!r}: invalid value {value!r} (true or false)")
    return out


def resolve(version: Any, overrides: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """The gates of ``version``: its defaults, then ``AllAlpha`` / ``AllBeta``, then ``overrides``.

    Refuses, as kube-apiserver does, a gate the version does not have and a locked gate set to
    the other value.
    """
    v = version_tuple(version)
    gates = defaults(v)
    overrides = dict(overrides or {})
    for name in overrides:
        if name in (ALL_ALPHA, ALL_BETA):
            continue
        if name not in GATES:
            raise FeatureGateError(f"unknown feature gate {name!r}; known gates: {_allowed()}")
        if name not in gates:
            first = GATES[name][0].since
            raise FeatureGateError(
                f"unrecognized feature gate: {name} (Kubernetes {v[0]}.{v[1]} has no such gate; it starts "
                f"in {first[0]}.{first[1]}); known gates: {', '.join(known(v))}")
    for bulk, stage_name in ((ALL_ALPHA, ALPHA), (ALL_BETA, BETA)):
        if bulk in overrides:
            for name in gates:
                stage = stage_at(name, v)
                if stage is not None and stage.stage == stage_name and not stage.locked:
                    gates[name] = overrides[bulk]
    for name, value in overrides.items():
        if name in (ALL_ALPHA, ALL_BETA):
            continue
        stage = stage_at(name, v)
        assert stage is not None
        if stage.locked and value != stage.default:
            raise FeatureGateError(f"cannot set feature gate {name} to {str(value).lower()}, "
                                   f"feature is locked to {str(stage.default).lower()}")
        gates[name] = value
    return gates


def all_enabled(version: Any) -> dict[str, bool]:
    """Every gate of ``version`` on: nothing is dropped (the server's behaviour without gates)."""
    return {g: True for g in known(version)}


def drop_disabled(obj: dict, old: dict | None, gates: Mapping[str, bool], *,
                  status: bool = False) -> list[Dropped]:
    """Remove from ``obj`` (in place) the fields kube-apiserver drops with ``gates``; what was dropped.

    ``old`` is the stored object on update (a field stays when ``old`` already used its feature),
    None on create. ``status`` selects the status subresource's rules (ResourceClaim status) instead
    of the main resource's. A gate missing from ``gates`` is one the version does not have: its
    fields are not the server's to drop (schema validation refuses them as unknown fields).
    """
    return drop_disabled_fields(obj, old, lambda name: bool(gates.get(name, True)), status=status)


def describe(gates: Mapping[str, bool], version: Any) -> str:
    """``A=true,B=false`` for the gates that differ from ``version``'s defaults (``""`` if none)."""
    base = defaults(version)
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()) if base.get(k) != v)

"""What each Kubernetes version vgpuctl supports serves, keeps and allows: the one place this knowledge lives.

Versions (and the one rule for a default), the DRA feature gates with their default per version,
the ResourceSlice fields each gate governs, and the API limits validation enforces. The pool
builder, the publisher, field detection, ``doctor``, the CLI and the simulated API server all read
it here. Pure data and functions.

Sources (kubernetes/kubernetes): gates from ``pkg/features/kube_features.go`` (1.34, 1.35) and, from
1.36 on, ``staging/src/k8s.io/kube-scheduler/pkg/features/kube_features.go`` where the DRA gates
moved; ``DRAResourcePoolStatus`` and ``DRAPartitionableDevicesType`` from the feature-gate pages of
kubernetes/website. Limits from ``staging/src/k8s.io/api/resource/v1/types.go``
(``ResourceSliceMaxDevices`` 128, ``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`` 64,
``ResourceSliceMaxCounterSets`` 8, ``ResourceSliceMaxCountersPerCounterSet`` 32,
``ResourceSliceMaxDeviceCounterConsumptionsPerDevice`` 2,
``ResourceSliceMaxCountersPerDeviceCounterConsumption`` 32, ``BindingConditionsMaxSize`` 4,
``BindingFailureConditionsMaxSize`` 4, ``ResourceSliceMaxAttributesAndCapacitiesPerDevice`` 32) and
``pkg/apis/resource/validation/validation.go``; 1.34's summed limits from its v1 types.

Only the DRA gates are modelled; ``DynamicResourceAllocation`` is left out (off would remove the
whole resource.k8s.io API).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

# ------------------------------------------------------------------ versions
SUPPORTED: tuple[tuple[int, int], ...] = ((1, 34), (1, 35), (1, 36), (1, 37))
#: Oldest version with ``resource.k8s.io/v1`` (the API vgpuctl publishes).
OLDEST = SUPPORTED[0]
NEWEST = SUPPORTED[-1]
#: The server version assumed wherever none is read from a cluster (``slices``, ``capacity``,
#: ``demo``, ``conformance`` on the simulated cluster): one release behind the newest one known, the
#: one most clusters run while the newest rolls out. With a cluster (``--kubeconfig``, ``serve``)
#: the server's own version is used, and what it keeps is found by effect.
DEFAULT_VERSION = SUPPORTED[-2]
VERSION_CHOICES = tuple(f"{a}.{b}" for a, b in SUPPORTED)


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


#: ``consumesCounters[].compatibilityGroups`` exists from this version (KEP-5963, alpha).
COMPATIBILITY_GROUPS_SINCE = (1, 37)
#: From this version a slice holds devices or ``sharedCounters``, never both (KEP-4815's v1 layout).
SPLIT_LAYOUT_SINCE = (1, 35)

# ------------------------------------------------------------------ the fields each gate governs
#: The DRA gates vgpuctl's published shape depends on, and the ResourceSlice fields each governs
#: (what kube-apiserver drops on write with the gate off: ``dropDisabledFields`` in
#: ``pkg/registry/resource/resourceslice/strategy.go``).
PARTITIONABLE = "DRAPartitionableDevices"
BINDING_CONDITIONS_GATE = "DRADeviceBindingConditions"
DEVICE_STATUS = "DRAResourceClaimDeviceStatus"
COMPATIBILITY_GROUPS = "DRADeviceCompatibilityGroups"
DEVICE_TAINTS = "DRADeviceTaints"
DEVICE_TAINT_RULES = "DRADeviceTaintRules"
SLICE_FIELDS: dict[str, tuple[str, ...]] = {
    PARTITIONABLE: ("spec.sharedCounters", "spec.devices[].consumesCounters", "spec.perDeviceNodeSelection",
                    "spec.devices[].nodeName", "spec.devices[].nodeSelector", "spec.devices[].allNodes"),
    BINDING_CONDITIONS_GATE: ("spec.devices[].bindingConditions", "spec.devices[].bindingFailureConditions",
                              "spec.devices[].bindsToNode"),
    COMPATIBILITY_GROUPS: ("spec.devices[].consumesCounters[].compatibilityGroups",),
    DEVICE_TAINTS: ("spec.devices[].taints",),
}



@dataclass
class KeptFields:
    """Which DRA field families an API server keeps on write, per family: True kept, False dropped,
    None unknown (never sent yet). Found by effect on a real server (``apiclient/kept.py``), or
    read off the gates (:func:`kept_by_gates`) where only a version and gates are given."""

    counters: bool | None = None  # sharedCounters / consumesCounters (DRAPartitionableDevices)
    compatibility_groups: bool | None = None  # consumesCounters[].compatibilityGroups (1.37 alpha gate)
    binding_conditions: bool | None = None  # devices[].bindingConditions (DRADeviceBindingConditions)
    taints: bool | None = None  # devices[].taints (DRADeviceTaints): how a cordon reaches the scheduler

    def describe(self) -> str:
        def word(v: bool | None) -> str:
            return "unknown" if v is None else "kept" if v else "DROPPED"
        return (f"counters {word(self.counters)}, compatibility groups {word(self.compatibility_groups)}, "
                f"binding conditions {word(self.binding_conditions)}, device taints {word(self.taints)}")

    def annotation(self) -> str:
        """``counters=kept,compatibilityGroups=dropped,bindingConditions=unknown,taints=kept``: for the node
        annotation."""
        def word(v: bool | None) -> str:
            return "unknown" if v is None else "kept" if v else "dropped"
        return (f"counters={word(self.counters)},compatibilityGroups={word(self.compatibility_groups)},"
                f"bindingConditions={word(self.binding_conditions)},taints={word(self.taints)}")

    def merged(self, later: KeptFields) -> KeptFields:
        """``later``'s knowledge where it has any, ours elsewhere."""
        return KeptFields(**{f.name: v if (v := getattr(later, f.name)) is not None else getattr(self, f.name)
                             for f in fields(self)})


def kept_by_gates(version: tuple[int, int], gates: Mapping[str, bool]) -> KeptFields:
    """What a server of ``version`` with ``gates`` (resolved: every gate of the version) keeps of the
    fields vgpuctl publishes. A field whose gate the version lacks is not kept (validation refuses it)."""
    binding = bool(gates.get(BINDING_CONDITIONS_GATE)) and bool(gates.get(DEVICE_STATUS, True))
    return KeptFields(counters=bool(gates.get(PARTITIONABLE)),
                      compatibility_groups=version >= COMPATIBILITY_GROUPS_SINCE and bool(gates.get(COMPATIBILITY_GROUPS)),
                      binding_conditions=binding, taints=bool(gates.get(DEVICE_TAINTS)))


# ------------------------------------------------------------------ device taints (KEP-5055)
#: The API version serving ``DeviceTaintRule`` per Kubernetes version, and the gate that governs it
#: (kube-apiserver serves the kind only with that gate on, and from 1.35 ``DRADeviceTaints`` too).
#: 1.33/1.34: ``v1alpha3`` under ``DRADeviceTaints``; 1.35: ``v1alpha3`` under its own
#: ``DRADeviceTaintRules``; 1.36: ``v1beta2`` (beta, off by default: its API version is off too);
#: 1.37: ``v1`` (GA, on). Sources: kubernetes/kubernetes PR 137170 ("DRA device taints: graduate to
#: beta": rules in v1beta2, off by default) and KEP-5055's 1.37 graduation; the kube-apiserver
#: ``--runtime-config`` an alpha or beta API version also needs is assumed given with the gate.
TAINT_RULE_API: dict[tuple[int, int], tuple[str, str]] = {
    (1, 34): ("resource.k8s.io/v1alpha3", DEVICE_TAINTS),
    (1, 35): ("resource.k8s.io/v1alpha3", DEVICE_TAINT_RULES),
    (1, 36): ("resource.k8s.io/v1beta2", DEVICE_TAINT_RULES),
    (1, 37): ("resource.k8s.io/v1", DEVICE_TAINT_RULES),
}
#: Taint effects the scheduler honours; ``None`` (1.35+) only reports.
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def taint_rule_api(version: Any) -> str:
    """``resource.k8s.io/<v>`` serving DeviceTaintRule on ``version``."""
    return TAINT_RULE_API[version_tuple(version)][0]


def taint_rules_served(version: Any, gates: Mapping[str, bool]) -> bool:
    """Whether a server of ``version`` with ``gates`` (resolved) serves DeviceTaintRule."""
    gate = TAINT_RULE_API[version_tuple(version)][1]
    return bool(gates.get(gate)) and bool(gates.get(DEVICE_TAINTS))


# --------------------------------------------------------------------------- upstream bugs

#: kubernetes#140434: the structured allocator keyed its shared-counter caches by pool name alone, so on
#: one node two drivers' pools of the same name share counter sets: a device of either can be refused, or
#: allowed, by the other's counters. Fixed by kubernetes#140435 (cherry-picked as #140504). Read in
#: k8s.io/dynamic-resource-allocation's source (``availableCounters`` in structured/internal/*/allocator_*.go):
#: v0.35.0-v0.35.10 and v0.36.0-v0.36.3 key it by the pool name, v0.36.4 and v0.37.0 on by ``PoolID`` (driver
#: and pool); v0.34 kept counter sets per slice. It matters where counters are kept (1.35 with
#: DRAPartitionableDevices, 1.36 by default).
POOL_NAME_COUNTERS_BUG = "kubernetes#140434"
POOL_NAME_COUNTERS_FIXED = ((1, 36, 4), (1, 37, 0))


def release(git_version: str | None) -> tuple[int, int, int] | None:
    """``v1.36.2`` (or ``v1.36.2-gke.1200``, ``v1.36.2+k3s1``) as (1, 36, 2); None when it is no release."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", git_version or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def counters_keyed_by_pool_name(git_version: str | None) -> bool:
    """Whether Kubernetes ``git_version``'s allocator has :data:`POOL_NAME_COUNTERS_BUG` (see there)."""
    r = release(git_version)
    return r is not None and (r[:2] == (1, 35) or (r[:2] == (1, 36) and r < POOL_NAME_COUNTERS_FIXED[0]))


# ------------------------------------------------------------------ API limits
# (the constants of resource/v1 types.go and validation.go, with the version a value changed in)
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64  # 1.35+
MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32
MAX_STRING_ATTRIBUTE_LENGTH = 64  # bytes
MAX_VERSION_ATTRIBUTE_LENGTH = 64
MAX_DRIVER_NAME_LENGTH = 63
MAX_POOL_NAME_LENGTH = 252
MAX_COUNTERS_PER_SLICE_1_34 = 32  # summed over all counter sets
MAX_COUNTER_SETS_PER_SLICE = 8  # 1.35+
MAX_COUNTERS_PER_COUNTER_SET = 32  # 1.35+
MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34 = 32
MAX_COUNTER_CONSUMPTIONS_PER_DEVICE = 2  # 1.35+: counter sets a device consumes from
MAX_CONSUMED_COUNTERS_PER_SET = 32  # 1.35+: counters per consumed set
MAX_COUNTER_CONSUMPTIONS_PER_SLICE_1_34 = 1024
MAX_TAINTS_PER_DEVICE_1_34 = 4
MAX_TAINTS_PER_DEVICE = 16  # 1.35+
MAX_COMPATIBILITY_GROUPS = 2  # 1.37+, per consumption
MAX_BINDING_CONDITIONS = 4  # per device (BindingConditionsMaxSize)
MAX_BINDING_FAILURE_CONDITIONS = 4  # per device (BindingFailureConditionsMaxSize)
MAX_FIRST_AVAILABLE = 8
MAX_OPAQUE_PARAMETERS_BYTES = 10 * 1024
MAX_RESERVED_FOR = 256
MAX_REQUESTS = 32  # per claim (DeviceRequestsMaxSize)
MAX_SELECTORS = 32  # per request or class (DeviceSelectorsMaxSize)
MAX_CONSTRAINTS = 32  # per claim (DeviceConstraintsMaxSize)
MAX_CONFIGS = 32  # per claim or class (DeviceConfigMaxSize)
MAX_CEL_LENGTH = 10 * 1024  # bytes of one CEL selector (CELSelectorExpressionMaxLength)
MAX_ID_LENGTH = 32  # the name part of a qualified attribute / capacity name
MAX_DOMAIN_LENGTH = 63
MAX_ATTRS_AND_CAPACITY = MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE


@dataclass(frozen=True)
class Limits:
    """What validation of ``resource.k8s.io/v1`` ResourceSlices rejects beyond, per version."""

    devices_per_slice: int = MAX_DEVICES_PER_SLICE
    devices_per_slice_with_counters: int = MAX_DEVICES_PER_SLICE  # when any device consumes counters or has taints
    counters_summed_per_slice: int | None = MAX_COUNTERS_PER_SLICE_1_34  # 1.34: over all sets of a slice
    counter_sets_per_slice: int | None = None  # 1.35+: 8
    counters_per_set: int = MAX_COUNTERS_PER_COUNTER_SET
    consumptions_per_slice: int | None = MAX_COUNTER_CONSUMPTIONS_PER_SLICE_1_34  # 1.34: summed over devices
    counters_per_device: int | None = MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34  # 1.34: over the device's consumptions
    counter_sets_per_device: int | None = None  # 1.35+: 2
    counters_per_consumption: int = MAX_CONSUMED_COUNTERS_PER_SET
    taints_per_device: int = MAX_TAINTS_PER_DEVICE_1_34
    attributes_and_capacity: int = MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE
    binding_conditions: int = MAX_BINDING_CONDITIONS
    binding_failure_conditions: int = MAX_BINDING_FAILURE_CONDITIONS
    compatibility_groups: int = 0  # per consumption; 1.37+: 2
    split: bool = False  # 1.35+: a slice holds devices or sharedCounters, never both


def limits_for(server_version: tuple[int, int]) -> Limits:
    v = checked_version(server_version)
    if v < SPLIT_LAYOUT_SINCE:
        return Limits()
    return Limits(
        devices_per_slice_with_counters=MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
        counters_summed_per_slice=None,
        counter_sets_per_slice=MAX_COUNTER_SETS_PER_SLICE,
        consumptions_per_slice=None,
        counters_per_device=None,
        counter_sets_per_device=MAX_COUNTER_CONSUMPTIONS_PER_DEVICE,
        taints_per_device=MAX_TAINTS_PER_DEVICE,
        compatibility_groups=MAX_COMPATIBILITY_GROUPS if v >= COMPATIBILITY_GROUPS_SINCE else 0,
        split=True,
    )


def checked_version(server_version: Iterable[int]) -> tuple[int, int]:
    v = tuple(int(x) for x in server_version)[:2]
    if len(v) != 2:
        raise ValueError(f"server_version: {server_version!r} is not (major, minor)")
    if v < OLDEST:
        raise ValueError(
            f"server_version {v[0]}.{v[1]}: resource.k8s.io/v1 ResourceSlices need Kubernetes "
            f"{format_version(OLDEST)} or newer"
        )
    return v


# ------------------------------------------------------------------ feature gates
ALPHA, BETA, GA = "Alpha", "Beta", "GA"
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
        raise ValueError(f"Kubernetes {version} not supported: use {format_version(OLDEST)} .. {format_version(NEWEST)}")
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


#: Gates that need others on (``defaultKubernetesFeatureGateDependencies``, pkg/features/kube_features.go of
#: v1.37.2; ``DynamicResourceAllocation`` left out: always on here), checked from 1.35, when
#: component-base's ``featuregate`` began refusing an enabled gate whose dependency is disabled.
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "DRADeviceBindingConditions": (DEVICE_STATUS,),
    COMPATIBILITY_GROUPS: (PARTITIONABLE,),
    DEVICE_TAINT_RULES: (DEVICE_TAINTS,),
    "DRAFractionalCapacityRange": ("DRAConsumableCapacity",),
    "DRAPartitionableDevicesType": (PARTITIONABLE, "DRAResourcePoolStatus"),
}
DEPENDENCIES_SINCE = (1, 35)


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
    if v >= DEPENDENCIES_SINCE:
        for name, deps in sorted(DEPENDS_ON.items()):
            off = [d for d in deps if d in gates and not gates[d]]
            if gates.get(name) and off:
                raise FeatureGateError(f"{name} is enabled, but depends on features that are disabled: "
                                       f"[{' '.join(off)}]")
    return gates


def all_enabled(version: Any) -> dict[str, bool]:
    """Every gate of ``version`` on: nothing is dropped (the server's behaviour without gates)."""
    return {g: True for g in known(version)}


def describe(gates: Mapping[str, bool], version: Any) -> str:
    """``A=true,B=false`` for the gates that differ from ``version``'s defaults (``""`` if none)."""
    base = defaults(version)
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()) if base.get(k) != v)

"""Blackwell boards: RTX PRO 6000 and RTX PRO 4500 Blackwell Server Edition, B200, B300 and GB200.

Facts from ../shared/reference/blackwell-vgpu.md (NVIDIA open-gpu-kernel-modules 595.45.04:
``vgpuSmcTypeIdMappings``, ``vgpu_aliases``, the placement code; vgpu-device-manager v0.5.0's
example config for the counts; mig-parted for the MIG profiles). What the reference marks
inferred or not found is named in each entry's ``inferred`` field:

* the MIG-backed type ids are the driver's (verified); of the time-sliced ids only DC-3Q 1519,
  DC-3A 1520 and DC-6Q 1523 were seen on a live host: the other Q ids follow their Q/A pairing
  (1519 + 2 per size), the C ids are placed after them: inferred;
* the full-GPU time-sliced types of B200/B300/GB200 (``B200X-180C``, ``B300X-269C``, ``GB200-189C``)
  have no published id: time-sliced ids live in the vGPU manager's vgpuConfig.xml, not in the open
  kernel modules (searched: 595.45.04 and a 580.173.02 copy of ``g_vgpu_resman_specific.h``,
  vgpu-device-manager v0.5.0, NVIDIA AI Enterprise's Blackwell tables). They carry PLACEHOLDER_IDS,
  marked inferred; on a real host the driver's own ids (sysfs ``creatable_vgpu_types``) are used;
* the A- and B-series counts of MIG-backed types (the example config lists Q and C only);
* the VF counts (the RTX PRO 6000's was truncated in every excerpt: 48, the MIG-backed maximum).

The RTX PRO 4500 BSE (GB203) is in docs/blackwell.md's "RTX PRO 4500" section, fact by fact.

Only GB20x (the RTX PRO 6000 and 4500) time-slices inside a GPU instance (``max_per_instance``, the GPU's
count over its instance count); on B200, B300 and GB200 a MIG-backed vGPU takes its instance whole.
"""

from __future__ import annotations

from mdev_manager.catalog_spec import BoardSpec, TypeSpec

RTX_PRO = "NVIDIA RTX Pro 6000 Blackwell"  # the driver's casing: "RTX Pro", not "RTX PRO"
RTX_PRO_4500 = "NVIDIA RTX PRO 4500 Blackwell"  # and here the driver's table writes "RTX PRO"

#: Ids no source publishes (see above): one per full-GPU time-sliced type, from a range no real type
#: in the catalog uses. ``discover --types`` marks them (INFERRED ``id``) and says they are placeholders.
PLACEHOLDER_IDS = {"B200X-180C": 9950, "GB200-189C": 9951, "B300X-269C": 9952}

# Time-sliced DC types: (GiB, max per GPU, series). At most 32 per GPU (NVA081_MAX_VGPU_PER_PGPU_NON_MIG).
_DC_SIZES = [(3, 32), (4, 24), (6, 16), (8, 12), (12, 8), (16, 6), (24, 4), (32, 3), (48, 2), (96, 1)]
_VERIFIED_IDS = {1519, 1520, 1523}


def _dc_time_sliced() -> list[TypeSpec]:
    out = []
    for i, (gb, most) in enumerate(_DC_SIZES):
        q = 1519 + 2 * i
        out.append(TypeSpec(num=q, name=f"{RTX_PRO} DC-{gb}Q", max_instances=most,
                            inferred=() if q in _VERIFIED_IDS else ("id",)))
    out.append(TypeSpec(num=1520, name=f"{RTX_PRO} DC-3A", max_instances=32, inferred=("max_instances",)))
    c_sizes = [(gb, most) for gb, most in _DC_SIZES if gb >= 8]
    out += [TypeSpec(num=1539 + i, name=f"{RTX_PRO} DC-{gb}C", max_instances=most, inferred=("id",))
            for i, (gb, most) in enumerate(c_sizes)]
    return out


# MIG-backed DC types (vgpuSmcTypeIdMappings, device 0x2BB510DE): GPU instance, instance count,
# then (GiB, max per GPU, {series: type id}).
_DC_MIG: list[tuple[str, int, list[tuple[int, int, dict[str, int]]]]] = [
    ("1g.24gb", 4, [
        (2, 48, {"Q": 1546, "A": 1547, "B": 1548}),
        (3, 32, {"Q": 1549, "A": 1550, "B": 2158}),
        (4, 24, {"Q": 1551, "A": 1552}),
        (6, 16, {"Q": 1553, "A": 1554}),
        (8, 12, {"Q": 1555, "A": 1556, "C": 1557}),
        (12, 8, {"Q": 1558, "A": 1559, "C": 1560}),
        (24, 4, {"Q": 1561, "A": 1562, "C": 1563}),
    ]),
    ("2g.48gb", 2, [
        (12, 8, {"Q": 1564, "A": 1565, "C": 1566}),
        (16, 6, {"Q": 1567, "A": 1568, "C": 1569}),
        (24, 4, {"Q": 1570, "A": 1571, "C": 1572}),
        (48, 2, {"Q": 1573, "A": 1574, "C": 1575}),
    ]),
    ("4g.96gb", 1, [
        (24, 4, {"Q": 1576, "A": 1577, "C": 1578}),
        (32, 3, {"Q": 1579, "A": 1580, "C": 1581}),
        (48, 2, {"Q": 1582, "A": 1583, "C": 1584}),
        (96, 1, {"Q": 1585, "A": 1586, "C": 1587}),
    ]),
]


def _dc_mig() -> list[TypeSpec]:
    out = []
    for profile, instances, rows in _DC_MIG:
        slices = int(profile.split("g.")[0])
        for gb, most, ids in rows:
            for series, num in ids.items():
                out.append(TypeSpec(
                    num=num, name=f"{RTX_PRO} DC-{slices}-{gb}{series}", max_instances=most, gi_profile=profile,
                    max_per_instance=most // instances,
                    # the example config counts Q and C; A and B are taken to match (same framebuffer)
                    inferred=("max_instances",) if series in "AB" else ()))
    return out


# RTX PRO 4500 BSE (PCI 10de:2c3a): MIG-backed types and ids from the driver's
# vgpuSmcTypeIdMappings for 0x2C3A10DE (g_vgpu_resman_specific.h of a release newer than 595.45.04,
# read in forks of open-gpu-kernel-modules: zaclanzon @ 722ae845, 580.173.02; wozeparrot @ d0f2587b)
# (DC-1-* on the half-GPU instance 1g.16gb, DC-2-* on the whole
# GPU 2g.32gb). Rows: (GiB, max per GPU, {series: type id}, the series a source counts). Counts from
# vgpu-device-manager v0.5.0 (DC-1-16, DC-2-8, DC-2-32: C and Q) and NVIDIA AI Enterprise's Table 52
# (DC-2-16C: 2; its "1" for DC-1-16C and "2" for DC-1-8C are per GPU instance); the rest by the
# Blackwell rule over a 16 GiB instance (16 // GiB per instance), inferred. The driver's table also
# has series-less DC-1-2 ... DC-2-32 (2232, 2236, ...; purpose undocumented, as the 6000's 1606-1620):
# left out.
_RTX4500_MIG: list[tuple[str, int, list[tuple[int, int, dict[str, int], str]]]] = [
    ("1g.16gb", 2, [
        (2, 16, {"Q": 2229, "A": 2230, "B": 2231}, ""),
        (3, 10, {"B": 2233}, ""),
        (4, 8, {"Q": 2234, "A": 2235}, ""),
        (8, 4, {"Q": 2237, "A": 2238, "C": 2239}, ""),
        (16, 2, {"Q": 2241, "A": 2242, "C": 2243}, "QC"),
    ]),
    ("2g.32gb", 1, [
        (8, 4, {"Q": 2245, "A": 2246, "C": 2247}, "QC"),
        (16, 2, {"Q": 2249, "A": 2250, "C": 2251}, "C"),
        (32, 1, {"Q": 2253, "A": 2254, "C": 2255}, "QC"),
    ]),
]

# Its time-sliced types: no id is published (placeholders 9960.., inferred). Names and counts:
# NVIDIA AI Enterprise Table 53 (DC-8C 4, DC-16C 2, DC-32C 1, equal- and mixed-size), vgpu-device-
# manager's default for 0x2C3A10DE (DC-16Q: 2), NVIDIA's vPC sizing guide (16 users of 2B, 10 of 3B
# per board; its B types' names, DC-2B and DC-3B, follow the 6000's grammar: inferred). DC-8Q and
# DC-32Q are inferred from the Q series the 6000 has beside each C size.
_RTX4500_TIME_SLICED: list[tuple[str, int, tuple[str, ...]]] = [
    ("DC-2B", 16, ("id", "name")), ("DC-3B", 10, ("id", "name")), ("DC-8C", 4, ("id",)),
    ("DC-8Q", 4, ("id", "name")), ("DC-16C", 2, ("id",)), ("DC-16Q", 2, ("id",)), ("DC-32C", 1, ("id",)),
    ("DC-32Q", 1, ("id", "name")),
]


def _rtx4500() -> list[TypeSpec]:
    out = [TypeSpec(num=9960 + i, name=f"{RTX_PRO_4500} {short}", max_instances=most, inferred=inferred)
           for i, (short, most, inferred) in enumerate(_RTX4500_TIME_SLICED)]
    for profile, instances, rows in _RTX4500_MIG:
        slices = int(profile.split("g.")[0])
        for gb, most, ids, counted in rows:
            for series, num in ids.items():
                out.append(TypeSpec(num=num, name=f"{RTX_PRO_4500} DC-{slices}-{gb}{series}", max_instances=most,
                                    gi_profile=profile, max_per_instance=most // instances,
                                    inferred=() if series in counted else ("max_instances",)))
    return out


def _one_per_instance(board: str, rows: list[tuple[int, str, int, str | None]]) -> list[TypeSpec]:
    """MIG-backed C types of GB100 boards, one vGPU per GPU instance: (id, slices-GB tail, max, profile)."""
    return [TypeSpec(num=num, name=f"NVIDIA {board}-{tail}", max_instances=most, gi_profile=profile)
            for num, tail, most, profile in rows]


BLACKWELL: list[BoardSpec] = [
    BoardSpec(
        key="RTX-PRO-6000-BSE", product_name="GB202GL [RTX PRO 6000 Blackwell Server Edition]",
        vendor_id="0x10de", device_id="0x2bb5", subsystem_device_id="0x204e", subsystem_aliases=("0x220b",),
        framebuffer_mib=96 * 1024, framework="vendor-vfio", sriov_total_vfs=48, mig_timeslicing=True,
        inferred=("sriov_total_vfs",),
        types=[*_dc_time_sliced(), *_dc_mig()],
    ),
    BoardSpec(
        key="RTX-PRO-4500-BSE", product_name="GB203 [RTX PRO 4500 Blackwell Server Edition]",
        vendor_id="0x10de", device_id="0x2c3a", subsystem_device_id="0x21f4",
        framebuffer_mib=32 * 1024, framework="vendor-vfio", sriov_total_vfs=16, mig_timeslicing=True,
        inferred=("sriov_total_vfs", "time-sliced type ids"),
        types=_rtx4500(),
    ),
    BoardSpec(
        key="B200", product_name="GB100 [B200]", vendor_id="0x10de", device_id="0x2901",
        subsystem_device_id="0x1999", subsystem_aliases=("0x199b", "0x20da"),
        framebuffer_mib=180 * 1024, framework="vendor-vfio", sriov_total_vfs=16, inferred=("sriov_total_vfs",),
        types=[
            TypeSpec(num=PLACEHOLDER_IDS["B200X-180C"], name="NVIDIA B200X-180C", max_instances=1, inferred=("id",)),
            *_one_per_instance("B200X", [
                (2152, "1-23C", 7, None), (2151, "1-23CME", 1, None), (2153, "1-45C", 4, None),
                (2154, "2-45C", 3, None), (2155, "3-90C", 2, None), (2156, "4-90C", 1, None),
                (2157, "7-180C", 1, None)]),
        ],
    ),
    BoardSpec(
        key="B300", product_name="GB110 [B300 SXM6 AC]", vendor_id="0x10de", device_id="0x3182",
        subsystem_device_id="0x20e6",
        framebuffer_mib=269 * 1024, framework="vendor-vfio", sriov_total_vfs=16, inferred=("sriov_total_vfs",),
        types=[
            TypeSpec(num=PLACEHOLDER_IDS["B300X-269C"], name="NVIDIA B300X-269C", max_instances=1, inferred=("id",)),
            *_one_per_instance("B300X", [
                (2258, "1-34C", 7, None), (2259, "1-34CME", 1, None), (2260, "1-67C", 4, None),
                (2261, "2-67C", 3, None), (2262, "3-135C", 2, None), (2263, "4-135C", 1, None),
                (2264, "7-269C", 1, None)]),
        ],
    ),
    BoardSpec(
        key="GB200", product_name="GB100 [GB200]", vendor_id="0x10de", device_id="0x2941",
        subsystem_device_id="0x2046",
        framebuffer_mib=189 * 1024, framework="vendor-vfio", sriov_total_vfs=16, inferred=("sriov_total_vfs",),
        types=[
            TypeSpec(num=PLACEHOLDER_IDS["GB200-189C"], name="NVIDIA GB200-189C", max_instances=1, inferred=("id",)),
            # HGX GB200's -lgip names its small instances 1g.24gb/1g.47gb/2g.47gb (the types' names);
            # mig-parted's table names the large ones 3g.93gb/4g.93gb/7g.186gb, not the types' 95/189
            *_one_per_instance("GB200", [
                (1446, "1-24C", 7, None), (1445, "1-24CME", 1, None), (1458, "1-47C", 4, None),
                (1447, "2-47C", 3, None), (1459, "3-95C", 2, "3g.93gb"), (1448, "4-95C", 1, "4g.93gb"),
                (1460, "7-189C", 1, "7g.186gb")]),
        ],
    ),
]

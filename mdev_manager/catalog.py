"""Real GPU boards and their vGPU types, as a knowledge table.

Data from ../shared/reference/vgpu-types.md (NVIDIA vgpuConfig.xml of driver 510.47.03,
vgpu-device-manager examples, harvester/pcidevices dumps, mdevctl and libvirt test data).
Used by the simulated host to build boards, and by discovery to know a type's maximum
count where the driver does not print it (vendor-specific VFIO lists no ``max_instance``).
Ids marked ``made_up`` are placeholders: the source lists them as unconfirmed.
"""

from __future__ import annotations

from functools import cache

from mdev_manager.catalog_blackwell import BLACKWELL
from mdev_manager.catalog_spec import BoardFramework, BoardSpec, TypeSpec, nv_desc
from mdev_manager.names import mig_profile_of, short_type_name

__all__ = ["BOARDS", "BoardFramework", "BoardSpec", "TypeSpec", "board", "gi_profile_of", "inferred_of", "known_type",
           "match_board"]


def _series(board: str, prefix: str, start: int, sizes: list[tuple[int, int]], series: str) -> list[TypeSpec]:
    """Consecutive ids for one series: sizes is [(GB, max instances)]."""
    return [
        TypeSpec(num=start + i, name=f"{prefix} {board}-{gb}{series}", max_instances=n)
        for i, (gb, n) in enumerate(sizes)
    ]


_T4_SIZES = [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
_A16_SIZES = _T4_SIZES
_L40S_SIZES = [(1, 32), (2, 24), (3, 16), (4, 12), (6, 8), (8, 6), (12, 4), (16, 3), (24, 2), (48, 1)]

BOARDS: dict[str, BoardSpec] = {}


def _add(b: BoardSpec) -> None:
    for t in b.types:
        if t.description is None and b.vendor_id == "0x10de":
            t.description = nv_desc(t)
    BOARDS[b.key] = b


_add(BoardSpec(
    key="T4", product_name="TU104GL [Tesla T4]", vendor_id="0x10de", device_id="0x1eb8", subsystem_device_id="0x12a2",
    framebuffer_mib=16384, framework="mdev",
    types=[
        TypeSpec(num=222, name="GRID T4-1B", max_instances=16),
        TypeSpec(num=223, name="GRID T4-2B", max_instances=8),
        TypeSpec(num=224, name="GRID T4-2B4", max_instances=8, framebuffer_mib=2048),
        TypeSpec(num=252, name="GRID T4-1B4", max_instances=16, framebuffer_mib=1024),
        *_series("T4", "GRID", 225, _T4_SIZES, "A"),
        *_series("T4", "GRID", 230, _T4_SIZES, "Q"),
        *_series("T4", "GRID", 319, [(4, 4), (8, 2), (16, 1)], "C"),
    ],
))
_add(BoardSpec(
    key="A100-40GB", product_name="GA100 [A100 PCIe 40GB]", vendor_id="0x10de", device_id="0x20f1", subsystem_device_id="0x145f",
    framebuffer_mib=40960, framework="mdev-sriov", sriov_total_vfs=16,
    types=[
        *_series("A100", "NVIDIA", 468, [(4, 10), (5, 8), (8, 5), (10, 4), (20, 2), (40, 1)], "C"),
        TypeSpec(num=474, name="NVIDIA A100-1-5C", max_instances=7),
        TypeSpec(num=475, name="NVIDIA A100-2-10C", max_instances=3),
        TypeSpec(num=476, name="NVIDIA A100-3-20C", max_instances=2),
        TypeSpec(num=477, name="NVIDIA A100-4-20C", max_instances=1),
        TypeSpec(num=478, name="NVIDIA A100-7-40C", max_instances=1),
        TypeSpec(num=706, name="NVIDIA A100-1-5CME", max_instances=1),
    ],
))
_add(BoardSpec(
    key="A100D-80GB", product_name="GA100 [A100 PCIe 80GB]", vendor_id="0x10de", device_id="0x20b5", subsystem_device_id="0x1533",
    framebuffer_mib=81920, framework="mdev-sriov", sriov_total_vfs=20,
    types=[
        *_series("A100D", "NVIDIA", 692, [(4, 20), (8, 10), (10, 8), (16, 5), (20, 4), (40, 2), (80, 1)], "C"),
        TypeSpec(num=699, name="NVIDIA A100D-1-10C", max_instances=7),
        TypeSpec(num=700, name="NVIDIA A100D-2-20C", max_instances=3),
        TypeSpec(num=701, name="NVIDIA A100D-3-40C", max_instances=2),
        TypeSpec(num=702, name="NVIDIA A100D-4-40C", max_instances=1),
        TypeSpec(num=703, name="NVIDIA A100D-7-80C", max_instances=1),
        TypeSpec(num=707, name="NVIDIA A100D-1-10CME", max_instances=1),
    ],
))
_add(BoardSpec(
    key="A16", product_name="GA107GL [A2 / A16]", vendor_id="0x10de", device_id="0x25b6", subsystem_device_id="0x14a9",
    framebuffer_mib=16384, framework="mdev-sriov", sriov_total_vfs=16, gpus_per_board=4,
    types=[
        TypeSpec(num=709, name="NVIDIA A16-1B", max_instances=16),
        TypeSpec(num=710, name="NVIDIA A16-2B", max_instances=8),
        *_series("A16", "NVIDIA", 711, _A16_SIZES, "Q"),
        *_series("A16", "NVIDIA", 716, _A16_SIZES, "A"),
        *_series("A16", "NVIDIA", 721, [(4, 4), (8, 2), (16, 1)], "C"),
    ],
))
_add(BoardSpec(
    key="A2", product_name="GA107GL [A2 / A16]", vendor_id="0x10de", device_id="0x25b6", subsystem_device_id="0x157e",
    framebuffer_mib=16384, framework="mdev-sriov", sriov_total_vfs=16,
    types=[
        TypeSpec(num=742, name="NVIDIA A2-1B", max_instances=16,
                 description="num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16"),
        TypeSpec(num=746, name="NVIDIA A2-4Q", max_instances=4),
        TypeSpec(num=754, name="NVIDIA A2-4C", max_instances=4,
                 description="num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2400, max_instance=4"),
    ],
))
_add(BoardSpec(
    key="L40S", vendor_id="0x10de", device_id="0x26b9", subsystem_device_id="0x1851", product_name="AD102GL [L40S]",
    framebuffer_mib=49152, framework="vendor-vfio", sriov_total_vfs=32,
    types=[
        TypeSpec(num=1145, name="NVIDIA L40S-1B", max_instances=32),
        TypeSpec(num=1146, name="NVIDIA L40S-2B", max_instances=24),
        TypeSpec(num=2164, name="NVIDIA L40S-3B", max_instances=16),
        *_series("L40S", "NVIDIA", 1147, _L40S_SIZES, "Q"),
        *_series("L40S", "NVIDIA", 1157, _L40S_SIZES, "A"),
    ],
))
# --- boards admins buy today (#13). Names and counts: NVIDIA vgpu-device-manager's
# examples/config-example.yaml (C and Q series, max per GPU in equal-size mode) and NVIDIA's vGPU
# user guide; device ids: NVIDIA gpu-admin-tools and pci.ids. Their vGPU type ids are not public
# for these driver branches: the ids below are placeholders (made_up_ids), in a range no real
# board uses here. Ada, Hopper and Blackwell offer vGPUs through vendor-specific VFIO only
# (vGPU 17+). MIG-backed types are named <board>-<slices>-<GB>C[ME] after the GPU instance they
# take whole (A100-3-20C -> 3g.20gb); their profiles are in catalog_mig.

def _mig_types(prefix: str, start: int, rows: list[tuple[str, int]]) -> list[TypeSpec]:
    """MIG-backed C types: rows are (slices-GB suffix, max per GPU)."""
    return [TypeSpec(num=start + i, name=f"NVIDIA {prefix}-{tail}", max_instances=n) for i, (tail, n) in enumerate(rows)]


_ADA_48 = [(1, 32), (2, 24), (3, 16), (4, 12), (6, 8), (8, 6), (12, 4), (16, 3), (24, 2), (48, 1)]
_ADA_24 = [(1, 24), (2, 12), (3, 8), (4, 6), (6, 4), (8, 3), (12, 2), (24, 1)]
_HOPPER_MIG = [("1-10C", 7), ("1-10CME", 1), ("1-20C", 4), ("2-20C", 3), ("3-40C", 2), ("4-40C", 1), ("7-80C", 1)]

_add(BoardSpec(
    key="L4", product_name="AD104GL [L4]", vendor_id="0x10de", device_id="0x27b8", subsystem_device_id="0x16ca",
    framebuffer_mib=24576, framework="vendor-vfio", sriov_total_vfs=24, made_up_ids=True,
    types=[*_series("L4", "NVIDIA", 9100, _ADA_24, "Q"), *_series("L4", "NVIDIA", 9120, _ADA_24[3:], "C")],
))
_add(BoardSpec(
    key="L40", product_name="AD102GL [L40]", vendor_id="0x10de", device_id="0x26b5", subsystem_device_id="0x169d",
    framebuffer_mib=49152, framework="vendor-vfio", sriov_total_vfs=32, made_up_ids=True,
    types=[*_series("L40", "NVIDIA", 9200, _ADA_48, "Q"), *_series("L40", "NVIDIA", 9220, _ADA_48[3:], "C")],
))
# L20: types and counts from NVIDIA AI Enterprise 6's Ada tables (Table 40) and the gpu-operator's
# vGPU config (L20-1Q..48Q, L20-4C..48C, as the L40's); device id 26ba (pci.ids, NVIDIA's
# open-gpu-kernel-modules README). Its VF count is not published: 32 assumed, as the L40/L40S.
_add(BoardSpec(
    key="L20", product_name="AD102GL [L20]", vendor_id="0x10de", device_id="0x26ba", subsystem_device_id="0x1957",
    framebuffer_mib=49152, framework="vendor-vfio", sriov_total_vfs=32, made_up_ids=True,
    types=[*_series("L20", "NVIDIA", 9250, _ADA_48, "Q"), *_series("L20", "NVIDIA", 9270, _ADA_48[3:], "C")],
))
_add(BoardSpec(
    key="A10", product_name="GA102GL [A10]", vendor_id="0x10de", device_id="0x2236", subsystem_device_id="0x1482",
    framebuffer_mib=24576, framework="vendor-vfio", sriov_total_vfs=24, made_up_ids=True,
    types=[*_series("A10", "NVIDIA", 9300, _ADA_24, "Q"), *_series("A10", "NVIDIA", 9320, _ADA_24[3:], "C")],
))
_add(BoardSpec(
    key="A40", product_name="GA102GL [A40]", vendor_id="0x10de", device_id="0x2235", subsystem_device_id="0x145a",
    framebuffer_mib=49152, framework="vendor-vfio", sriov_total_vfs=32, made_up_ids=True,
    types=[*_series("A40", "NVIDIA", 9400, _ADA_48, "Q"), *_series("A40", "NVIDIA", 9420, _ADA_48[3:], "C")],
))
_add(BoardSpec(
    key="A30", product_name="GA100GL [A30 PCIe]", vendor_id="0x10de", device_id="0x20b7", subsystem_device_id="0x1532",
    framebuffer_mib=24576, framework="vendor-vfio", sriov_total_vfs=8, made_up_ids=True,
    types=[*_series("A30", "NVIDIA", 9500, [(4, 6), (6, 4), (8, 3), (12, 2), (24, 1)], "C"),
           *_mig_types("A30", 9520, [("1-6C", 4), ("1-6CME", 1), ("2-12C", 2), ("2-12CME", 1), ("4-24C", 1)])],
))
_add(BoardSpec(
    key="H100-80GB", product_name="GH100 [H100 PCIe]", vendor_id="0x10de", device_id="0x2331", subsystem_device_id="0x1626",
    framebuffer_mib=81920, framework="vendor-vfio", sriov_total_vfs=20, made_up_ids=True,
    types=[*_series("H100", "NVIDIA", 9600, [(4, 20), (5, 16), (8, 10), (10, 8), (16, 5), (20, 4), (40, 2), (80, 1)], "C"),
           *_mig_types("H100", 9620, _HOPPER_MIG)],
))
_add(BoardSpec(
    key="H100-NVL", product_name="GH100 [H100 NVL]", vendor_id="0x10de", device_id="0x2321", subsystem_device_id="0x1839",
    framebuffer_mib=96256, framework="vendor-vfio", sriov_total_vfs=23, made_up_ids=True,
    types=[*_series("H100L", "NVIDIA", 9700, [(4, 23), (6, 15), (11, 8), (15, 6), (23, 4), (47, 2), (94, 1)], "C"),
           *_mig_types("H100L", 9720, [("1-12C", 7), ("1-12CME", 1), ("1-24C", 4), ("2-24C", 3), ("3-47C", 2),
                                       ("4-47C", 1), ("7-94C", 1)])],
))
_add(BoardSpec(
    key="H200", product_name="GH100 [H200 NVL]", vendor_id="0x10de", device_id="0x233b", subsystem_device_id="0x1996",
    framebuffer_mib=144384, framework="vendor-vfio", sriov_total_vfs=32, made_up_ids=True,
    types=[*_series("H200", "NVIDIA", 9800, [(4, 32), (7, 20), (8, 16), (14, 10), (17, 8), (28, 5), (35, 4), (70, 2),
                                              (141, 1)], "C"),
           *_mig_types("H200", 9820, [("1-18C", 7), ("1-18CME", 1), ("1-35C", 4), ("2-35C", 3), ("3-71C", 2),
                                      ("4-71C", 1), ("7-141C", 1)])],
))
_add(BoardSpec(
    key="H20", product_name="GH100 [H20]", vendor_id="0x10de", device_id="0x2329", subsystem_device_id="0x198b",
    framebuffer_mib=98304, framework="vendor-vfio", sriov_total_vfs=24, made_up_ids=True,
    types=_series("H20", "NVIDIA", 9900, [(4, 24), (6, 16), (8, 12), (12, 8), (16, 6), (24, 4), (32, 3), (48, 2), (96, 1)], "C"),
))

for _b in BLACKWELL:
    _add(_b)

_add(BoardSpec(
    key="UHD630", product_name="CoffeeLake-S GT2 [UHD Graphics 630]", vendor_id="0x8086", device_id="0x3e92",
    class_code="0x030000",
    subsystem_vendor_id="0x8086", subsystem_device_id="0x2212",
    framebuffer_mib=4096, framework="mdev", driver="i915",
    types=[
        TypeSpec(num="i915-GVTg_V5_8", name="GVTg_V5_8", max_instances=7, framebuffer_mib=448,
                 description="low_gm_size: 64MB\nhigh_gm_size: 384MB\nfence: 4\nresolution: 1024x768\nweight: 2\n"),
        TypeSpec(num="i915-GVTg_V5_4", name="GVTg_V5_4", max_instances=5, framebuffer_mib=640,
                 description="low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\nresolution: 1920x1200\nweight: 4\n"),
        TypeSpec(num="i915-GVTg_V5_2", name="GVTg_V5_2", max_instances=2, framebuffer_mib=1280,
                 description="low_gm_size: 256MB\nhigh_gm_size: 1024MB\nfence: 4\nresolution: 1920x1200\nweight: 8\n"),
        TypeSpec(num="i915-GVTg_V5_1", name="GVTg_V5_1", max_instances=1, framebuffer_mib=2560,
                 description="low_gm_size: 512MB\nhigh_gm_size: 2048MB\nfence: 4\nresolution: 1920x1200\nweight: 16\n"),
    ],
))


@cache
def _by_name() -> dict[str, TypeSpec]:
    out: dict[str, TypeSpec] = {}
    for b in BOARDS.values():
        for t in b.types:
            out[t.name.lower()] = t
            out.setdefault(t.short_name.lower(), t)
    return out


def known_type(name: str, board_spec: BoardSpec | None = None) -> TypeSpec | None:
    """The catalog entry for a type by full or short name, for limits the driver does not print.

    Short names are not unique across boards (``DC-8C`` is an RTX PRO 6000 and an RTX PRO 4500
    Server Edition type): given the GPU's board (matched by PCI ids), its own entry wins."""
    if board_spec is not None:
        low, short = name.lower(), short_type_name(name).lower()
        own = next((t for t in board_spec.types if t.name.lower() == low), None) or next(
            (t for t in board_spec.types if t.short_name.lower() == short), None)
        if own is not None:
            return own
    return _by_name().get(name.lower()) or _by_name().get(short_type_name(name).lower())


def namesakes(name: str) -> list[tuple[BoardSpec, TypeSpec]]:
    """Each board's type of the short name ``name`` (``DC-2-16Q``: the RTX PRO 6000's and the RTX PRO
    4500's), for a caller that knows no GPU to tell them apart by; [] for a full name (it names its
    board) or an unknown one."""
    short = name.strip().lower()
    if short != short_type_name(name).lower():
        return []
    out = []
    for b in BOARDS.values():
        t = next((t for t in b.types if t.short_name.lower() == short), None)
        if t is not None:
            out.append((b, t))
    return out


def gi_profile_of(name: str, board_spec: BoardSpec | None = None) -> str | None:
    """The GPU-instance profile a MIG-backed type lives on: the catalog's word where the name's
    grammar says otherwise (DC-2-12Q: a 12 GiB vGPU on 2g.48gb), else the grammar (A100-3-20C: 3g.20gb)."""
    known = known_type(name, board_spec)
    if known is not None and known.gi_profile:
        return known.gi_profile
    return mig_profile_of(name)


def inferred_of(type_id: str, board_spec: BoardSpec | None) -> tuple[str, ...]:
    """What the catalog infers about a board's type (by mdev or vendor-VFIO id), for discover --types."""
    if board_spec is None:
        return ()
    t = next((t for t in board_spec.types if type_id in (str(t.num), t.mdev_id(board_spec.driver))), None)
    return t.inferred if t else ()


def board(key: str) -> BoardSpec:
    try:
        return BOARDS[key]
    except KeyError:
        raise KeyError(f"board: {key!r} is not in the catalog; known boards: {', '.join(sorted(BOARDS))}") from None


def match_board(vendor_id: str, device_id: str, subsystem_device_id: str | None = None) -> BoardSpec | None:
    """The catalog board for a PCI function (subsystem id breaks ties such as A2 / A16)."""
    hits = [b for b in BOARDS.values() if b.vendor_id == vendor_id and b.device_id == device_id]
    exact = [b for b in hits if subsystem_device_id in (b.subsystem_device_id, *b.subsystem_aliases)]
    return next(iter(exact or hits), None)

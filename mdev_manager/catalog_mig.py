"""MIG GPU-instance profiles of the boards that have MIG, as NVML reports them.

Sources (cited per table below): NVIDIA's MIG user guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), and
``nvidia-smi mig -lgip`` / ``-lgipp`` outputs of the boards. A row is one profile:
``(name, NVML profile id, max instances, memory MiB, SMs, copy engines, decoders, encoders,
JPEG, OFA, placement starts, placement size)``. The simulated host builds its NVML from these
tables; the node manager and the DRA bridge read profiles from NVML, never from here.
"""

from __future__ import annotations

from functools import cache

from mdev_manager.models import GpuInstanceProfile, MigPlacement

Row = tuple[str, int, int, int, int, int, int, int, int, int, tuple[int, ...], int]


def _profiles(rows: list[Row]) -> list[GpuInstanceProfile]:
    return [GpuInstanceProfile(id=pid, name=name, slices=int(name.split("g.")[0]), instances=n, memory_mib=mib,
                               multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=enc, jpeg_engines=jpg,
                               ofa_engines=ofa, placements=[MigPlacement(start=s, size=size) for s in starts])
            for name, pid, n, mib, sm, ce, dec, enc, jpg, ofa, starts, size in rows]


# A few memory sizes differ by 128-256 MiB between driver branches; one branch's values are kept.
# A30 24GB: MIG user guide (A30 table) and `nvidia-smi mig -lgip`/`-lgipp` on an A30 (1g.6gb has
# one decoder there, where the guide's table says none: nvidia-smi wins). 4 memory slices.
_A30: list[Row] = [
    ("1g.6gb", 14, 4, 5952, 14, 1, 1, 0, 0, 0, (0, 1, 2, 3), 1),
    ("1g.6gb+me", 21, 1, 5952, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3), 1),
    ("2g.12gb", 5, 2, 11968, 28, 2, 2, 0, 0, 0, (0, 2), 2),
    ("2g.12gb+me", 6, 1, 11968, 28, 2, 2, 0, 1, 1, (0, 2), 2),
    ("4g.24gb", 0, 1, 24000, 56, 4, 4, 0, 1, 1, (0,), 4),
]

# A100 40GB (SXM4 and PCIe): MIG user guide (A100 table and its -lgip / -lgipp example,
# A100-SXM4-40GB); 1g.10gb (id 15) exists from R525 on. 8 memory slices, 7 compute slices.
_A100_40GB: list[Row] = [
    ("1g.5gb", 19, 7, 4864, 14, 1, 0, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.5gb+me", 20, 1, 4864, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb", 15, 4, 9856, 14, 1, 1, 0, 0, 0, (0, 2, 4, 6), 2),
    ("2g.10gb", 14, 3, 9856, 28, 2, 1, 0, 0, 0, (0, 2, 4), 2),
    ("3g.20gb", 9, 2, 19968, 42, 3, 2, 0, 0, 0, (0, 4), 4),
    ("4g.20gb", 5, 1, 19968, 56, 4, 2, 0, 0, 0, (0,), 4),
    ("7g.40gb", 0, 1, 40192, 98, 7, 5, 0, 1, 1, (0,), 8),
]

# A100 80GB (SXM4 and PCIe): the guide: "profile names change according to the memory
# proportion"; -lgip of an A100-SXM4-80GB; placements as on the 40GB board.
_A100_80GB: list[Row] = [
    ("1g.10gb", 19, 7, 9728, 14, 1, 0, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb+me", 20, 1, 9728, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.20gb", 15, 4, 19968, 14, 1, 1, 0, 0, 0, (0, 2, 4, 6), 2),
    ("2g.20gb", 14, 3, 19968, 28, 2, 1, 0, 0, 0, (0, 2, 4), 2),
    ("3g.40gb", 9, 2, 40192, 42, 3, 2, 0, 0, 0, (0, 4), 4),
    ("4g.40gb", 5, 1, 40192, 56, 4, 2, 0, 0, 0, (0,), 4),
    ("7g.80gb", 0, 1, 80896, 98, 7, 5, 0, 1, 1, (0,), 8),
]

# H100 80GB HBM3 (SXM5): -lgip / -lgipp of an "NVIDIA H100 80GB HBM3"; the guide's H100 table
# (1g.10gb: 1 NVDEC, 1 JPEG; 7g.80gb: 7 NVDEC, 7 JPEG, 1 OFA, 8 copy engines).
_H100_80GB: list[Row] = [
    ("1g.10gb", 19, 7, 9984, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb+me", 20, 1, 9984, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.20gb", 15, 4, 20096, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.20gb", 14, 3, 20096, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.40gb", 9, 2, 40448, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.40gb", 5, 1, 40448, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.80gb", 0, 1, 81152, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# H100 NVL 94GB: -lgip / -lgipp on driver 560.35.03 (NVIDIA/gpu-operator#900, NVIDIA/mig-parted#101).
_H100_NVL: list[Row] = [
    ("1g.12gb", 19, 7, 11008, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.12gb+me", 20, 1, 11008, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.24gb", 15, 4, 22144, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.24gb", 14, 3, 22144, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.47gb", 9, 2, 47488, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.47gb", 5, 1, 47488, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.94gb", 0, 1, 95360, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# H200 141GB: -lgip rows 1g.18gb .. 4g.71gb (NVIDIA/mig-parted#120), 7g.141gb and the engines from
# the guide's H200 table; placements follow the guide's memory fractions, the same as H100's
# (no -lgipp output of an H200 was found: the geometry is taken from H100).
_H200: list[Row] = [
    ("1g.18gb", 19, 7, 16384, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.18gb+me", 20, 1, 16384, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.35gb", 15, 4, 33024, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.35gb", 14, 3, 33024, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.71gb", 9, 2, 71168, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.71gb", 5, 1, 71168, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.141gb", 0, 1, 143360, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# Blackwell (../shared/reference/blackwell-vgpu.md). No -lgipp output of any Blackwell board was
# found: every placement below is inferred (MIG_INFERRED), as are the profile ids, memory sizes and
# engines the -lgip excerpts cut off. RTX PRO 6000 BSE: -lgip rows 1g.24gb (14, 4, 23.12 GiB on a
# vGPU host, 46 SMs), +me (21), +gfx (47), +me.all (65); counts from mig-parted; 4 memory slices
# (4 instances at most, 2 x 2g, 1 x 4g), ids of 2g/4g as on the A30 (the other 4-slice board).
_RTX_PRO_6000: list[Row] = [
    ("1g.24gb", 14, 4, 23674, 46, 1, 1, 1, 1, 0, (0, 1, 2, 3), 1),
    ("1g.24gb+me", 21, 1, 23674, 46, 1, 1, 1, 1, 1, (0, 1, 2, 3), 1),
    ("1g.24gb+gfx", 47, 4, 23674, 46, 1, 1, 1, 1, 0, (0, 1, 2, 3), 1),
    ("1g.24gb+me.all", 65, 1, 23674, 46, 1, 1, 1, 1, 1, (0, 1, 2, 3), 1),
    ("1g.24gb-me", 66, 4, 23674, 46, 1, 0, 0, 0, 0, (0, 1, 2, 3), 1),
    ("2g.48gb", 5, 2, 47488, 94, 2, 2, 2, 2, 0, (0, 2), 2),
    ("2g.48gb+gfx", 48, 2, 47488, 94, 2, 2, 2, 2, 0, (0, 2), 2),
    ("2g.48gb+me.all", 67, 1, 47488, 94, 2, 2, 2, 2, 1, (0, 2), 2),
    ("2g.48gb-me", 68, 2, 47488, 94, 2, 0, 0, 0, 0, (0, 2), 2),
    ("4g.96gb", 0, 1, 95000, 188, 4, 4, 4, 4, 1, (0,), 4),
    ("4g.96gb+gfx", 49, 1, 95000, 188, 4, 4, 4, 4, 1, (0,), 4),
]

# RTX PRO 4500 BSE 32GB (GB203): MIG user guide "Supported GPUs" (max 2 instances); the profile
# names 1g.16gb and 2g.32gb from NVIDIA AI Enterprise's Table 52 and the driver's type table (DC-1-*
# on the half-GPU partition, DC-2-* on the whole GPU). No -lgip output was found: ids, memory sizes,
# SMs, engines and the 2-slot geometry are inferred (the 6000's 1g id 14, the whole GPU's id 0).
_RTX_PRO_4500: list[Row] = [
    ("1g.16gb", 14, 2, 15744, 41, 1, 1, 1, 1, 0, (0, 1), 1),
    ("2g.32gb", 0, 1, 31616, 82, 2, 2, 2, 2, 1, (0,), 2),
]

# B200 180GB: -lgip rows 1g.23gb (19, 7, 22 GiB, 18 SMs), +me (20), 1g.45gb (15, 4, 44.25 GiB),
# 2g.45gb (14, 3) (NVIDIA/mig-parted#166, #187); 3g/4g/7g counts from mig-parted's config, their
# ids (9/5/0), sizes and the whole geometry inferred from H100/H200 (same ids, counts and ratios).
_B200: list[Row] = [
    ("1g.23gb", 19, 7, 22528, 18, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.23gb+me", 20, 1, 22528, 18, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.45gb", 15, 4, 45312, 18, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.45gb", 14, 3, 45312, 36, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.90gb", 9, 2, 90880, 54, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.90gb", 5, 1, 90880, 72, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.180gb", 0, 1, 182272, 148, 8, 7, 0, 7, 1, (0,), 8),
]

# B300 269GB: profile names and counts from mig-parted's config for 0x318210DE; everything else
# as the B200's (inferred).
_B300: list[Row] = [
    ("1g.34gb", 19, 7, 33792, 18, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.34gb+me", 20, 1, 33792, 18, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.67gb", 15, 4, 68096, 18, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.67gb", 14, 3, 68096, 36, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.135gb", 9, 2, 136448, 54, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.135gb", 5, 1, 136448, 72, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.269gb", 0, 1, 273408, 148, 8, 7, 0, 7, 1, (0,), 8),
]

# GB200: -lgip of an HGX GB200 (NVIDIA/gpu-operator#1303): 1g.24gb (19, 7), +me (20), 1g.47gb
# (15, 4), 2g.47gb (14, 3); 3g.93gb, 4g.93gb, 7g.186gb from mig-parted's config (other GB200s name
# the small ones 1g.23gb: mig-parted#227); the rest as the B200's (inferred).
_GB200: list[Row] = [
    ("1g.24gb", 19, 7, 23552, 18, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.24gb+me", 20, 1, 23552, 18, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.47gb", 15, 4, 47104, 18, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.47gb", 14, 3, 47104, 36, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.93gb", 9, 2, 94208, 54, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.93gb", 5, 1, 94208, 72, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.186gb", 0, 1, 189440, 148, 8, 7, 0, 7, 1, (0,), 8),
]

#: What the Blackwell tables infer (shown by vgpuctl discover --types; NVML's own answers win).
MIG_INFERRED: dict[str, tuple[str, ...]] = {
    "RTX-PRO-6000-BSE": ("MIG placements", "MIG profile ids of 2g/4g and -me variants", "MIG engines"),
    "RTX-PRO-4500-BSE": ("MIG placements", "MIG profile ids", "MIG memory sizes", "MIG engines"),
    "B200": ("MIG placements", "MIG profile ids of 3g/4g/7g", "MIG engines"),
    "B300": ("MIG placements", "MIG profile ids", "MIG engines"),
    "GB200": ("MIG placements", "MIG profile ids of 3g/4g/7g", "MIG engines"),
}

MIG_TABLES: dict[str, list[Row]] = {
    "A30": _A30,
    "A100-40GB": _A100_40GB,
    "A100D-80GB": _A100_80GB,
    "H100-80GB": _H100_80GB,
    "H100-NVL": _H100_NVL,
    "H200": _H200,
    "RTX-PRO-6000-BSE": _RTX_PRO_6000,
    "RTX-PRO-4500-BSE": _RTX_PRO_4500,
    "B200": _B200,
    "B300": _B300,
    "GB200": _GB200,
}

#: Memory slices per board: the widest placement's end.
MEMORY_SLICES: dict[str, int] = {k: max(s + size for *_, starts, size in rows for s in starts)
                                 for k, rows in MIG_TABLES.items()}


@cache
def mig_profiles(board_key: str) -> tuple[GpuInstanceProfile, ...]:
    """The board's GPU-instance profiles; () for a board without MIG."""
    return tuple(_profiles(MIG_TABLES.get(board_key, [])))


def has_mig(board_key: str) -> bool:
    return board_key in MIG_TABLES

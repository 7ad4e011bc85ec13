"""Bugs the campaign finds in the code as it is, each with the violation it shows and a fix.

The campaign itself fails on them (``python -m tests.campaign`` exits 1: a violation is never only
logged). Two places use this table until each fix lands:

* ``tests/system/test_campaign.py`` marks a run as an expected failure (``xfail``, naming the
  bug) when *every* violation of its failing step is one of these; any other violation fails it;
* ``python -m tests.campaign.mutations`` applies each fix to its scratch copy (never to this
  checkout), so the mutations are measured against a campaign that passes, and mutation (i) is
  the first fix left out.

A fix whose text is no longer in the code has landed, or the code moved: the mutations script
says so, and the entry should go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Known:
    what: str
    shows: re.Pattern  # matches each violation line it causes
    fix: tuple[Patch, ...]


KNOWN: dict[str, Known] = {
    "metadata-by-name": Known(
        "unprepare removes KEP-5304 metadata by the claim's namespace/name (dra_bridge/kubeletplugin/driver.py, "
        "Driver._files): a claim re-created under that name with a new uid loses its metadata when the old uid "
        "is unprepared. Fix (scratch): remove a metadata file only when it names this uid; another engineer "
        "changes metadata.py to delete by uid",
        re.compile(r"dra-device-metadata/\S+ is missing"),
        (Patch("dra_bridge/kubeletplugin/driver.py",
               "        own = self.paths.owns\n"
               "        return ([f for f in dict.fromkeys(cdi_files) if own(f)], "
               "[f for f in dict.fromkeys(metadata_files) if own(f)])\n",
               "        own = self.paths.owns\n"
               "\n"
               "        def mine(f):  # SCRATCH FIX: a metadata file that names another claim's uid is not ours\n"
               "            import json\n"
               "            try:\n"
               "                return json.loads(self.io.read(Path(f)).splitlines()[0])['metadata']['uid'] == rec.uid\n"
               "            except Exception:  # noqa: BLE001\n"
               "                return True\n"
               "        return ([f for f in dict.fromkeys(cdi_files) if own(f)],\n"
               "                [f for f in dict.fromkeys(metadata_files) if own(f) and mine(f)])\n"),),
    ),
    "dra-passthrough-held": Known(
        "a dra GPU left on vfio-pci by an earlier passthrough layout and held by a VM (no claim) is skipped by the "
        "plan but not reported blocked (mdev_manager/blocked.py only looks at vgpu mode): apply exits 0 and the "
        "agent labels the node success while the GPU differs from its layout. Fix (scratch): report it blocked, "
        "as in vgpu mode, unless a claim passes it through",
        re.compile(r"\(dra\) blocked: group drivers .*\(no claim passes it through\)"),
        (Patch("mdev_manager/blocked.py",
               '        if (gpu is not None and modes.get(gpu.address) == "vgpu" and gpu.driver == "vfio-pci"',
               '        if (gpu is not None and modes.get(gpu.address) == "dra" and gpu.driver == "vfio-pci"  # SCRATCH FIX\n'
               '                and (users := group_users(gpu, usage))\n'
               '                and not any(u.startswith("ResourceClaim ") for u in users)):\n'
               '            out.append(Blocked(device=gpu.address, gpu=gpu.address, held_by=users,\n'
               '                               blocks="its return to its native driver for DRA claims"))\n'
               '            continue\n'
               '        if (gpu is not None and modes.get(gpu.address) == "vgpu" and gpu.driver == "vfio-pci"'),),
    ),
    "mig-after-passthrough": Known(
        "a layout of MIG-backed vGPUs for a GPU that is passed through (on vfio-pci, where NVML does not see it) "
        "is rejected as bad input (mdev_manager/migplan.py, check_mig_layout: 'has no MIG'), so apply exits 2 "
        "and the agent labels the layout failed, for good: the GPU never gets back from passthrough to MIG "
        "vGPUs. Fix (scratch): leave the MIG check to the round after the GPU is back on its native driver",
        re.compile(r"is MIG-backed; GPU \d+ \(\S+, .*\) has no MIG \(NVML reports none for it\)"),
        (Patch("mdev_manager/migplan.py",
               "    if gpu.mig is None:\n        return [f\"{where}: {mig_types[0][0].name} is MIG-backed;",
               "    if gpu.mig is None and gpu.driver in (None, \"vfio-pci\"):  # SCRATCH FIX: known once it is back\n"
               "        return []\n"
               "    if gpu.mig is None:\n        return [f\"{where}: {mig_types[0][0].name} is MIG-backed;"),),
    ),
}


def violations(failure: str) -> list[str]:
    """The violation lines of a campaign failure (between its first line and "what the step saw")."""
    lines = failure.split("\n  what the step saw:")[0].splitlines()[1:]
    return [ln.strip() for ln in lines if ln.strip()]


def which(failure: str) -> list[str]:
    """The known bugs that explain every violation of ``failure``; empty when one is not known."""
    found = []
    for line in violations(failure):
        keys = [k for k, b in KNOWN.items() if b.shows.search(line)]
        if not keys:
            return []
        found += [k for k in keys if k not in found]
    return found

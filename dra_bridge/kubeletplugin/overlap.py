"""One device, one claim: the check prepare runs before it makes anything (pure).

Split from :mod:`.driver`, which calls :func:`overlap` under its lock with the checkpoint's records.
"""

from __future__ import annotations

from dra_bridge.kubeletplugin.state import ClaimRecord
from dra_bridge.pool.devices import Pool
from dra_bridge.rpc.types import ClaimRef


def _owner(rec: ClaimRecord) -> str:
    name = f"{rec.namespace}/{rec.name}" if rec.namespace else "(name not recorded)"
    return f"claim {name} (uid {rec.uid})"


def overlap(ref: ClaimRef, results: list[dict], pool_name: str, pool: Pool,
            claims: dict[str, ClaimRecord]) -> str | None:
    """Why ``ref`` may not take the devices allocated to it; None when no other claim holds them.

    Two claims allocated one device (a scheduler race, a pod force-deleted while its claim is
    still prepared here) must not both prepare: two vGPUs for one published slot, or one VM's
    GPU handed to another. NVIDIA's driver refuses the same (kubernetes-sigs/dra-driver-nvidia-gpu,
    cmd/gpu-kubelet-plugin/device_state.go, ``validateNoOverlappingPreparedDevices``; see
    kubernetes/kubernetes#136269). Decided differently here:

    * nothing is exempt: the pool never publishes ``allowMultipleAllocations`` (no shareable
      device, so no ``shareID``) and preparing makes the vGPU or binds the GPU, which cannot be
      shared, so ``adminAccess`` (exempt at NVIDIA) is not either;
    * every record holds its devices until its claim is unprepared: ``preparing`` ones (they may
      have made some) and those of an earlier boot (their claim re-creates them at its next
      prepare) too, where NVIDIA counts completed ones only and forgets them at a reboot;
    * "the same device" is physical: a passed-through GPU and a vGPU on it (or the GPU's
      passthrough device under another name) clash; both kinds of record name their GPU;
    * the claim's own record is not another claim (a repeated prepare answers before this runs);
      one device twice within the claim is refused too.
    """
    held: list[tuple[str, str | None, str | None, str | None, str | None, bool]] = [
        (_owner(rec), d.pool, d.device, d.kind, d.gpu, False)
            for rec in claims.values() if rec.uid != ref.uid for d in rec.devices]
    for r in results:
        name, where = r.get("device"), r.get("pool")
        dev = pool.device(name or "") if where == pool_name else None
        kind, gpu = (dev.kind, dev.gpu) if dev else (None, None)
        for who, h_pool, h_name, h_kind, h_gpu, mine in held:
            if (h_pool, h_name) == (where, name):
                why = f"device {name} is already {'allocated to' if mine else 'prepared for'} {who}"
            elif gpu and gpu == h_gpu and kind == "passthrough" and h_kind == "vgpu":
                why = f"device {name} is the whole GPU {gpu}, which holds vGPUs: {h_name} of {who}"
            elif gpu and gpu == h_gpu and h_kind == "passthrough":
                why = f"device {name} is on GPU {gpu}, which is passed through whole as {h_name} to {who}"
            else:
                continue
            if mine:
                return f"{why}; one device serves one request"
            return (f"{why}; one device serves one claim (allocated twice: a scheduler race or a force-deleted "
                    "pod), this one prepares once that claim is unprepared")
        held.append((f"request {r.get('request')} of this claim", where, name, kind, gpu, True))
    return None

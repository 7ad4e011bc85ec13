"""The kubelet plugin's pure checks and wording: names from API objects checked before they become
paths or checkpoint keys, whether a record's devices may still be live, how a claim is named."""

from __future__ import annotations

from dra_bridge.kubeletplugin import metadata
from dra_bridge.kubeletplugin.effects import PrepareError
from dra_bridge.kubeletplugin.paths import UnsafeName, check_label, check_name, check_namespace, check_request, check_uid
from dra_bridge.kubeletplugin.state import ClaimRecord
from dra_bridge.rpc.types import ClaimRef


def n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def may_be_live(rec: ClaimRecord, boot: str | None) -> bool:
    """False only for a record known to come from another boot: its devices died with it."""
    return boot is None or rec.boot_id is None or rec.boot_id == boot


def rebuilt_how(rec: ClaimRecord) -> str:
    if not rec.cdi_files and not rec.metadata_files:
        return ", no files: held from its allocation"
    return "" if rec.boot_id else ", to re-create"


def who(rec: ClaimRecord) -> str:
    return f"{rec.namespace}/{rec.name}" if rec.namespace else f"uid {rec.uid}"


def fill_identity(rec: ClaimRecord, ref: ClaimRef) -> None:
    """A record rebuilt from a CDI spec alone learns its namespace and name from the kubelet (checked)."""
    if rec.namespace:
        return
    try:
        rec.namespace, rec.name = check_namespace(ref.namespace), check_name(ref.name)
    except UnsafeName:
        pass


def check_ref(ref: ClaimRef) -> None:
    """The kubelet's claim identity becomes checkpoint keys and paths: check it first."""
    try:
        check_namespace(ref.namespace)
        check_name(ref.name)
        check_uid(ref.uid)
    except UnsafeName as exc:
        raise PrepareError(f"claim {ref.namespace!r}/{ref.name!r} (uid {ref.uid!r}) refused: {exc}; "
                           "nothing was prepared") from None


def check_results(ref: ClaimRef, claim: dict, results: list[dict]) -> None:
    """Request and device names and the pod's claim name become paths or CDI names: check them
    all before the first device is made."""
    try:
        for r in results:
            check_request(r.get("request"))
            check_label(r.get("device"), f"device of request {r.get('request')!r}")
        metadata.pod_claim_name(claim)
    except UnsafeName as exc:
        raise PrepareError(f"claim {ref.namespace}/{ref.name} refused: {exc}; nothing was prepared") from None

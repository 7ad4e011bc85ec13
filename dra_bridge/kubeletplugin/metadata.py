"""KEP-5304 device metadata, the file KubeVirt v1.8+ reads to find a claim's vGPU or PCI device.

Host file ``<data dir>/dra-device-metadata/<ns>_<claim>/<request>/metadata.json``, bound
read-only into the container by a CDI spec of kind ``<driver>/metadata`` (dra.md).
KubeVirt 1.9 accepts only ``metadata.resource.k8s.io/v1alpha1`` and reads ``mdevUUID``
first, then ``resource.kubernetes.io/pciBusID``. The path is the claim's name, not its uid: the
``metadata.uid`` inside says which claim owns the file (:mod:`.claimfiles`).
"""

from __future__ import annotations

import json
from pathlib import Path

from dra_bridge.kubeletplugin.paths import check_label, check_name, check_namespace, check_request, check_uid, contained
from mdev_manager.host.io import HostIO

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def base_request(request: str) -> str:
    """``req/sub`` (a firstAvailable sub-request) keeps only ``req`` in paths."""
    return request.split("/", 1)[0]


def host_file(metadata_dir: Path, namespace: str, claim: str, request: str) -> Path:
    """UnsafeName unless every part is a valid Kubernetes name and the file stays in ``metadata_dir``.

    ``<ns>_<claim>`` cannot be ambiguous: a namespace (a DNS label) holds no ``_``.
    """
    base = base_request(check_request(request))
    path = Path(metadata_dir) / f"{check_namespace(namespace)}_{check_name(claim)}" / base / "metadata.json"
    return contained(metadata_dir, path)


def claim_dir_name(name: str) -> tuple[str, str] | None:
    """(namespace, claim) from a ``<ns>_<claim>`` directory name (recovery), None if it is not one."""
    namespace, sep, claim = name.partition("_")
    try:
        return (check_namespace(namespace), check_name(claim)) if sep else None
    except ValueError:
        return None


def pod_claim_name(claim: dict) -> str | None:
    """The pod's name for the claim (a DNS label, checked: it becomes a container path)."""
    pod_claim = (claim["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
    return None if pod_claim is None else check_label(pod_claim, f"annotation {POD_CLAIM_ANNOTATION}")


def container_path(driver: str, claim: dict, request: str) -> str:
    pod_claim = pod_claim_name(claim)
    if pod_claim:
        return f"{CONTAINER_ROOT}/resourceclaimtemplates/{pod_claim}/{base_request(request)}/{driver}-metadata.json"
    return f"{CONTAINER_ROOT}/resourceclaims/{claim['metadata']['name']}/{base_request(request)}/{driver}-metadata.json"


def document(claim: dict, request: str, devices: list[dict]) -> dict:
    """One metadata object; ``devices`` are ``{driver, pool, name, attributes}``."""
    meta = claim["metadata"]
    doc = {
        "kind": "DeviceMetadata",
        "apiVersion": API_VERSION,
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default"), "uid": meta["uid"],
                     "generation": meta.get("generation", 1)},
        "requests": [{"name": base_request(request), "devices": devices}],
    }
    pod_claim = (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
    if pod_claim:
        doc["podClaimName"] = pod_claim
    return doc


def write(io: HostIO, path: Path, doc: dict, durable: bool = False) -> None:
    """A stream of JSON objects, one per metadata version, each followed by a newline."""
    io.write_atomic(path, json.dumps(doc) + "\n", durable=durable)
    path.chmod(0o644)


def cdi_id(driver: str, claim_uid: str, request: str) -> str:
    return f"{driver}/metadata={claim_uid}_{base_request(request)}"


def cdi_spec(driver: str, claim_uid: str, request: str, host: Path, container: str) -> tuple[dict, str]:
    name = f"{claim_uid}_{base_request(request)}"
    spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{driver}/metadata",
        "devices": [{"name": name, "containerEdits": {"mounts": [
            {"hostPath": str(host), "containerPath": container, "options": ["ro", "bind"]}]}}],
    }
    return spec, cdi_id(driver, claim_uid, request)


def cdi_path(cdi_root: Path, driver: str, claim_uid: str, request: str) -> Path:
    name = f"{driver}_metadata_{check_uid(claim_uid)}_{base_request(check_request(request))}.json"
    return contained(cdi_root, Path(cdi_root) / name)


def parse_cdi_name(driver: str, file_name: str) -> str | None:
    """The claim uid a metadata CDI spec file is named for (recovery), None for any other file."""
    prefix, suffix = f"{driver}_metadata_", ".json"
    if not (file_name.startswith(prefix) and file_name.endswith(suffix)):
        return None
    uid = file_name[len(prefix):-len(suffix)][:36]
    try:
        return check_uid(uid)
    except ValueError:
        return None

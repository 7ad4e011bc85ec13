"""KEP-5304 device metadata, the file KubeVirt v1.8+ reads to find a claim's vGPU or PCI device.

Host file ``<data dir>/dra-device-metadata/<ns>_<claim>/<request>/metadata.json``, bound
read-only into the container by a CDI spec of kind ``<driver>/metadata`` (dra.md).
KubeVirt 1.9 accepts only ``metadata.resource.k8s.io/v1alpha1`` and reads ``mdevUUID``
first, then ``resource.kubernetes.io/pciBusID``.
"""

from __future__ import annotations

import json
from pathlib import Path

from mdev_manager.host.io import HostIO

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def base_request(request: str) -> str:
    """``req/sub`` (a firstAvailable sub-request) keeps only ``req`` in paths."""
    return request.split("/", 1)[0]


def host_file(metadata_dir: Path, namespace: str, claim: str, request: str) -> Path:
    return Path(metadata_dir) / f"{namespace}_{claim}" / base_request(request) / "metadata.json"


def container_path(driver: str, claim: dict, request: str) -> str:
    pod_claim = (claim["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
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


def write(io: HostIO, path: Path, doc: dict) -> None:
    """A stream of JSON objects, one per metadata version, each followed by a newline."""
    io.write_atomic(path, json.dumps(doc) + "\n", durable=False)
    path.chmod(0o644)


def cdi_spec(driver: str, claim_uid: str, request: str, host: Path, container: str) -> tuple[dict, str]:
    name = f"{claim_uid}_{base_request(request)}"
    spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{driver}/metadata",
        "devices": [{"name": name, "containerEdits": {"mounts": [
            {"hostPath": str(host), "containerPath": container, "options": ["ro", "bind"]}]}}],
    }
    return spec, f"{driver}/metadata={name}"


def cdi_path(cdi_root: Path, driver: str, claim_uid: str, request: str) -> Path:
    return Path(cdi_root) / f"{driver}_metadata_{claim_uid}_{base_request(request)}.json"

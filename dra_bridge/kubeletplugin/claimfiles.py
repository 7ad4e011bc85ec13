"""Which of the node's files a claim owns, and their removal: never another claim's.

CDI specs are named by the claim's uid (:mod:`.cdi`, :func:`.metadata.cdi_path`): each is one
claim's alone. A KEP-5304 metadata file is not: its path is ``<ns>_<claim>/<request>/metadata.json``
(KubeVirt finds it by namespace, name and request, dra.md), so a claim deleted and re-created under
the same name (a VM restarted) writes the same path as its predecessor, usually before the kubelet
unprepares the predecessor. The file itself records the uid it was written for (``metadata.uid``),
and only the claim the API server holds under that name writes it (the driver checks the uid
before every write), so the uid in the file is the newest claim's: its owner.

A claim removes a metadata file only while the file names the claim's uid (or names none and no
other recorded claim has that name); a prepared claim whose file now names another uid is not
answered with it, and loses its metadata CDI device when the newer claim takes the file over.
Callers hold the driver's lock, under which every one of these files is written, so what is read
here cannot change before the removal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import cdi, metadata
from dra_bridge.kubeletplugin.paths import UnsafeName
from dra_bridge.kubeletplugin.state import ClaimRecord
from mdev_manager.host.io import HostIO

log = logging.getLogger(__name__)


def owner(io: HostIO, path: Path | str) -> str | None:
    """The claim uid a metadata file was written for; None when it is missing, unreadable or names none."""
    try:
        text = io.read(Path(path))
    except OSError:
        return None
    try:
        doc = json.loads(text.split("\n", 1)[0])  # a stream: one object per line, the first is enough
    except ValueError:
        return None
    uid = (doc.get("metadata") or {}).get("uid") if isinstance(doc, dict) else None
    return uid if isinstance(uid, str) else None


def write_metadata(io: HostIO, paths: NodePaths, path: Path, doc: dict, request: str) -> None:
    """Write a claim's metadata file. Taking it over from an earlier claim of the same name also
    removes that claim's CDI device for it: a container of the old claim started now would mount
    this claim's file (its vGPU); it gets an unresolvable CDI id instead. A take-over is written
    durably: lost in a power cut, the file would name the earlier uid again while the checkpoint
    records this claim prepared, and this claim would be refused as if the earlier one were newer."""
    before, uid = owner(io, path), doc["metadata"]["uid"]
    if before is not None and before != uid:
        try:
            io.remove(metadata.cdi_path(paths.cdi_root, paths.driver, before, request))
        except UnsafeName:
            pass  # not a uid: no spec of its name was ever written
        log.info("claim %s/%s (uid %s) takes over %s from uid %s, an earlier claim of the same name (its "
                 "metadata CDI device removed)", doc["metadata"]["namespace"], doc["metadata"]["name"], uid, path,
                 before)
    metadata.write(io, path, doc, durable=before not in (None, uid))


def files_of(paths: NodePaths, rec: ClaimRecord) -> tuple[list[str], list[str]]:
    """The claim's CDI and metadata files: recorded ones plus the deterministic paths prepare
    writes (a crash after writing them but before the final checkpoint left them unrecorded).
    Only files below the plugin's own directories, whatever the record says."""
    cdi_files = list(rec.cdi_files)
    metadata_files = list(rec.metadata_files)
    try:
        cdi_files.append(str(cdi.spec_path(paths.cdi_root, paths.driver, rec.uid)))
        for request in sorted({d.request for d in rec.devices if d.request}):
            cdi_files.append(str(metadata.cdi_path(paths.cdi_root, paths.driver, rec.uid, request)))
            if rec.namespace and rec.name:
                metadata_files.append(str(metadata.host_file(paths.metadata_dir, rec.namespace, rec.name, request)))
    except UnsafeName:
        pass  # a record the checkpoint's validation let through cannot name a path; keep what is recorded
    own = paths.ownership()
    return ([f for f in dict.fromkeys(cdi_files) if own(f)], [f for f in dict.fromkeys(metadata_files) if own(f)])


def taken_over(io: HostIO, paths: NodePaths, rec: ClaimRecord) -> list[tuple[str, str]]:
    """(file, uid) of each of the claim's metadata files that now describes another claim: one
    re-created under the same name and prepared since."""
    out = []
    for f in files_of(paths, rec)[1]:
        uid = owner(io, f)
        if uid is not None and uid != rec.uid:
            out.append((f, uid))
    return out


def _named_for(driver: str, file: str, uid: str) -> bool:
    name = Path(file).name
    return uid in (cdi.parse_spec_name(driver, name), metadata.parse_cdi_name(driver, name))


def remove(io: HostIO, paths: NodePaths, rec: ClaimRecord, others: Iterable[ClaimRecord]) -> None:
    """Remove the claim's CDI specs and the metadata files it still owns, then their emptied
    directories. ``others``: every record in the checkpoint (the claim's own is skipped); a metadata
    file that names no uid is left where another of them has the claim's namespace and name."""
    cdi_files, metadata_files = files_of(paths, rec)
    for f in cdi_files:
        if _named_for(paths.driver, f, rec.uid):  # a spec named for another uid is never this claim's
            io.remove(Path(f))
    namesakes = {f"{o.namespace}_{o.name}" for o in others if o.uid != rec.uid and o.namespace and o.name}
    own = paths.ownership()
    for f in metadata_files:
        uid = owner(io, f)
        if uid not in (rec.uid, None) or (uid is None and Path(f).parent.parent.name in namesakes):
            if io.exists(Path(f)):
                log.info("claim %s/%s (uid %s): left %s in place: it describes %s, a claim of the same name "
                         "made since", rec.namespace, rec.name, rec.uid, f, f"uid {uid}" if uid else "another claim")
            continue
        io.remove(Path(f))
        for parent in (Path(f).parent, Path(f).parent.parent):  # the per-claim directories, once empty
            if not own(parent):
                continue
            try:
                io.rmdir(parent)
            except OSError:
                pass

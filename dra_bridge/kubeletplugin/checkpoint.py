"""The prepared-claims checkpoint: versioned, self-checking, written atomically (fsync, rename)
before prepare answers.

An entry is first written ``preparing`` with the vGPU ids it is about to create, then
``prepared``; a restart finds any ``preparing`` entry and undoes what it may have made,
so a crash between creating a vGPU and recording it leaves no orphan.

On disk: ``{"checksum": sha256(data), "data": {"version": N, "claims": {uid: record}}}``.
A file of an older version is migrated step by step on load (one pure function per step)
and written back in the current version at the next save; versions only add fields, so an
older plugin still reads a newer file. A file that cannot be trusted (not JSON, not this
shape, a bad checksum, a version this code does not know, a record that fails validation,
a directory) raises :class:`CheckpointCorrupt`; the driver then moves it aside
(:meth:`CheckpointStore.quarantine`) and rebuilds the state from what the node shows.

Since version 2 each claim records the boot (``/proc/sys/kernel/random/boot_id``) its devices
were made in: after a reboot they are gone, and the record says so. Version 3 adds the
``unpreparing`` state: unprepare records its intent before removing anything, so a crash half-way
is finished at the next start instead of leaving a "prepared" claim whose devices are gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import stat
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from dra_bridge.kubeletplugin.state import CURRENT_VERSION, Checkpoint
from mdev_manager.host.io import HostIO, RealIO

log = logging.getLogger(__name__)

MAX_BYTES = 64 << 20  # thousands of claims fit in a few MiB; a bigger "checkpoint" is not one


class CheckpointCorrupt(RuntimeError):
    """The checkpoint cannot be trusted; the message says why."""


# --------------------------------------------------------------------------- versions (pure)


def _v1_to_v2(data: dict) -> dict:
    """Version 2 records the boot per claim; a version 1 claim's boot is not known."""
    claims = data.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointCorrupt("version 1 data has no claims map")
    out = {uid: {**rec, "boot_id": None} if isinstance(rec, dict) else rec for uid, rec in claims.items()}
    return {**data, "version": 2, "claims": out}


def _v2_to_v3(data: dict) -> dict:
    """Version 3 adds the ``unpreparing`` state (an unprepare's intent); version 2 records are unchanged."""
    return {**data, "version": 3}


#: version N -> version N+1
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3}


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def parse(text: str) -> Checkpoint:
    """The checkpoint a file's text holds, migrated to the current version; CheckpointCorrupt else."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CheckpointCorrupt(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict) or "checksum" not in doc:
        raise CheckpointCorrupt(f"not a checkpoint (a JSON {type(doc).__name__} without checksum and data)")
    data = doc["data"]
    if doc["checksum"] != _digest(json.dumps(data, sort_keys=True)):
        raise CheckpointCorrupt("it fails its checksum")
    version = data.get("version")
    if type(version) is not int or not 1 <= version <= CURRENT_VERSION:
        raise CheckpointCorrupt(f"version {version!r} is not one this plugin knows (1..{CURRENT_VERSION})")
    while version < CURRENT_VERSION:
        data = MIGRATIONS[version](data)
        version = data["version"]
    try:
        return Checkpoint.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CheckpointCorrupt(f"invalid at {where or 'top level'}: {first['msg']}") from None


def serialize(cp: Checkpoint) -> str:
    data = cp.model_copy(update={"version": CURRENT_VERSION}).model_dump(mode="json")
    body = json.dumps(data, sort_keys=True)  # dumped once: the file is exactly
    # json.dumps({"checksum": ..., "data": data}, sort_keys=True), the checksum's text reused
    return _document(body)


def _document(body: str) -> str:
    return f'{{"checksum": {json.dumps(_digest(body))}, "data": {body}}}'


class Serializer:
    """:func:`serialize`, the same text, at a fraction of its cost for a checkpoint that changed in
    a few records: each record's sorted JSON is kept, keyed by its pydantic dump (made in Rust, about
    a fifth of the sorted dump's cost), so an unchanged record is not dumped again. The key is the
    record's whole content: a record changed in place can never be written stale."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def __call__(self, cp: Checkpoint) -> str:
        texts: dict[str, str] = {}
        parts = []
        for uid in sorted(cp.claims):
            key = cp.claims[uid].model_dump_json()
            text = self._texts.get(key)
            if text is None:
                text = json.dumps(json.loads(key), sort_keys=True)
            texts[key] = text
            parts.append(f"{json.dumps(uid)}: {text}")
        self._texts = texts  # the records of this snapshot only
        return _document(f'{{"claims": {{{", ".join(parts)}}}, "version": {CURRENT_VERSION}}}')


# --------------------------------------------------------------------------- the file


class CheckpointStore:
    def __init__(self, path: Path, io: HostIO | None = None):
        self.path = Path(path)
        self.io = io or RealIO()

    def load(self) -> Checkpoint:
        """The checkpoint (empty when there is none); CheckpointCorrupt when it cannot be trusted."""
        try:
            st = self.io.stat(self.path)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointCorrupt("not a regular file")
            if st.st_size > MAX_BYTES:
                raise CheckpointCorrupt(f"{st.st_size} bytes, more than the {MAX_BYTES} a checkpoint may hold")
            text = self.io.read(self.path)
        except FileNotFoundError:
            return Checkpoint()
        except OSError as exc:  # an unreadable file
            raise CheckpointCorrupt(f"unreadable ({exc.strerror or exc})") from None
        return parse(text)

    def save(self, cp: Checkpoint) -> None:
        self.write(serialize(cp))

    def write(self, text: str) -> None:
        """Write a checkpoint already serialised (:func:`serialize`)."""
        self.io.write_atomic(self.path, text)

    def quarantine(self) -> Path:
        """Move the file (or directory) aside as ``<name>.corrupt-<UTC time>``, kept for inspection."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while self.io.exists(aside):
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        self.io.rename(self.path, aside)
        return aside

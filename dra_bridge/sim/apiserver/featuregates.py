"""What the local API server drops on write for a set of feature gates.

The gates themselves (which each version has, their defaults, parsing ``--feature-gates``) are
:mod:`dra_bridge.api.compat`'s; which fields each gate's ``dropDisabledFields`` removes, with the
rule for updates, is :mod:`.dropfields`.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_bridge.sim.apiserver.dropfields import Dropped, drop_disabled_fields


def drop_disabled(obj: dict, old: dict | None, gates: Mapping[str, bool], *,
                  status: bool = False) -> list[Dropped]:
    """Remove from ``obj`` (in place) the fields kube-apiserver drops with ``gates``; what was dropped.

    ``old`` is the stored object on update (a field stays when ``old`` already used its feature),
    None on create. ``status`` selects the status subresource's rules (ResourceClaim status) instead
    of the main resource's. A gate missing from ``gates`` is one the version does not have: its
    fields are not the server's to drop (schema validation refuses them as unknown fields).
    """
    return drop_disabled_fields(obj, old, lambda name: bool(gates.get(name, True)), status=status)

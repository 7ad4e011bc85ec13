"""The node agent's settings (``vgpuctl serve``'s options), apart from the agent's logic."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.nodepaths import DEFAULT_CDI_ROOT, DEFAULT_KUBELET_ROOT


class ServeConfig(BaseModel):
    node_name: str = Field(description="this node (NODE_NAME from the downward API)")
    driver: str = DEFAULT_DRIVER
    layout_file: Path | None = None
    layout: str = "default"
    resync_seconds: float = 30.0
    server_version: tuple[int, int] | None = None
    metrics_port: int | None = 8080
    kubelet_root: Path = DEFAULT_KUBELET_ROOT
    cdi_root: Path = DEFAULT_CDI_ROOT
    health_poll_seconds: float = 5.0
    health_quiet_seconds: float = Field(300.0, ge=0, description=(
        "an unhealthy GPU is tainted at the first problem seen and untainted only after this long without one "
        "(a flapping GPU does not flap the slices)"))
    gpu_lost_effect: Literal["NoSchedule", "NoExecute"] = Field("NoSchedule", description=(
        "the effect of a lost GPU's taint (gpu-lost): NoExecute (opt-in) has kube-controller-manager evict the "
        "pods whose claims hold the GPU; the other health taints are always NoSchedule"))
    device_plugin: bool = Field(False, description="also serve the classic device plugin for non-DRA GPUs")
    resource_prefix: str = "nvidia.com/"
    layout_label: str | None = Field(None, description="node label naming the layout to apply (else `layout`)")
    state_label: str | None = Field(None, description="node label reporting pending | success | failed")
    full_resync_seconds: float | None = Field(None, description=(
        "a periodic resync skips discovery and publishing when nothing changed (host fingerprint, layout, "
        "claims, published slices); at least this often it does everything anyway (default 10 x resync_seconds)"))
    sizes_by_first_allocation: bool = Field(False, description=(
        "where the server keeps counters but neither compatibility groups nor binding conditions: offer every "
        "size of an empty GPU and republish it with the size of its first allocation (an allocation of another "
        "size in between fails at prepare); default: one size per GPU, which never does"))
    bind_seconds: float = Field(1.0, gt=0, description=(
        "how often to look again whether binding conditions are in use, and to retry after an error (in "
        "use, a watch of the claims wakes the agent at each change)"))
    probe_seconds: float = Field(300.0, description=(
        "how often to check again which DRA fields the API server keeps (a dry-run ResourceSlice): servers upgrade"))

"""The accelerator health check every conformance workload runs (and the demo's workloads too).

:data:`SCRIPT` is a POSIX sh script (busybox, Debian, Fedora and UBI images all run it), kept here
as text so that it ships inside the installed package; ``python -m dra_bridge.conformance.healthcheck --print``
writes it out, ``vgpuctl conformance`` puts it in a ConfigMap for a real cluster's pods, and
:func:`run` runs it against given device nodes (the simulated cluster passes the host paths of
the CDI device nodes, with ``VGPUCTL_HC_SYS`` pointing at the simulated host's sysfs).

It inspects the devices it is given (vfio groups, their members' PCI ids and drivers, the
physical GPU behind a VF or an mdev, ``nvidia-smi`` where present) and reports Pass, Fail, or
Unknown for an accelerator it does not recognise, which is not a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = ("Pass", "Fail", "Unknown")
#: kubernetes-sigs/ai-conformance's probe markers, printed by the script before its verdict.
MARKERS = ("ACCELERATOR_FOUND", "ACCELERATOR_MISSING")

SCRIPT = r'''#!/bin/sh
# vgpuctl accelerator health check (POSIX sh: runs in busybox, Debian, Fedora, UBI images).
#
# Inspects the accelerator devices a workload was given and reports, per device and overall,
# Pass, Fail, or Unknown (an accelerator this script does not recognise: not a failure).
#
#   healthcheck.sh [DEVICE_NODE ...]
#
# DEVICE_NODE: a vfio device node the workload got (/dev/vfio/vfio, /dev/vfio/<group>). Without
# arguments: $VGPUCTL_HC_DEVICES (space-separated), else every /dev/vfio/<group> present, else (a VM
# guest, where the vGPU is a PCI device) every NVIDIA display/3D controller under /sys/bus/pci.
#
# Environment: VGPUCTL_HC_SYS   sysfs root (default /sys; the simulated host's sys/ in tests)
#              VGPUCTL_HC_VFIO  the directory scanned when no device is named (default /dev/vfio)
#
# For a vfio group it checks that the device node exists, that sysfs knows the IOMMU group, and
# for every member: PCI vendor/device/class ids, the driver (vfio-pci; vfio_mdev for an mdev
# vGPU; nvidia with a vGPU type set for an NVIDIA vendor-specific VFIO VF) and the physical GPU
# it belongs to. For a PCI GPU bound to nvidia it runs `nvidia-smi` where present and checks the
# GPU is listed. Output, one line per finding, then the verdict:
#
#   CHECK <device> <Pass|Fail|Unknown> key=value ... -- <words>
#   RESULT: <ACCELERATOR_FOUND|ACCELERATOR_MISSING>   (ai-conformance's marker: a vfio group device
#            node, or inside a VM a /dev/nvidiaN, the container can open)
#   RESULT: <Pass|Fail|Unknown>
#
# Exit status 0 for Pass and Unknown, 1 for Fail.

SYS=${VGPUCTL_HC_SYS:-/sys}
VFIO=${VGPUCTL_HC_VFIO:-/dev/vfio}
DEV=${VGPUCTL_HC_DEV:-/dev}
FAILS=0
PASSES=0
UNKNOWNS=0
ACCEL=0

say() { # device result fields... -- text
    echo "CHECK $*"
    case "$2" in
        Pass) PASSES=$((PASSES + 1)) ;;
        Fail) FAILS=$((FAILS + 1)) ;;
        *) UNKNOWNS=$((UNKNOWNS + 1)) ;;
    esac
}

readf() { [ -r "$1" ] && head -n 1 "$1" 2>/dev/null | tr -d ' \n'; }

driver_of() { [ -e "$1/driver" ] && basename "$(readlink "$1/driver")"; }

# physical GPU of a PCI function: the PF behind a VF, else the function itself
gpu_of() {
    if [ -e "$1/physfn" ]; then basename "$(cd "$1/physfn" && pwd -P)"; else basename "$1"; fi
}

recognised() { # vendor class -> 0 when an accelerator this script knows
    case "$1:$2" in
        0x10de:0x03*) return 0 ;;   # NVIDIA display / 3D controller
        0x8086:0x03*) return 0 ;;   # Intel GPU (GVT-g vGPUs)
    esac
    return 1
}

nvidia_smi_lists() { # PCI address -> 0 when nvidia-smi lists that GPU
    command -v nvidia-smi >/dev/null 2>&1 || return 2
    nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null \
        | tr 'A-F' 'a-f' | grep -q "$(echo "$1" | tr 'A-F' 'a-f' | sed 's/^0000://')\$"
}

check_function() { # node group sysfs-dir [mdev-uuid]
    node=$1 group=$2 dir=$3 mdev=$4
    addr=$(basename "$dir")
    vendor=$(readf "$dir/vendor")
    device=$(readf "$dir/device")
    class=$(readf "$dir/class")
    drv=$(driver_of "$dir")
    gpu=$(gpu_of "$dir")
    if [ -z "$vendor" ]; then
        say "$node" Fail "group=$group function=$addr" -- "no PCI vendor id in sysfs"
        return
    fi
    case "$class" in 0x0403*|0x0604*) return ;; esac   # the GPU's HDA audio, bridges: not accelerators
    ids="id=${vendor#0x}:${device#0x} class=$class"
    if [ -n "$mdev" ]; then
        tname=$(head -n 1 "$mdev/mdev_type/name" 2>/dev/null | tr ' ' '_')
        [ -z "$tname" ] && tname=$(basename "$(readlink "$mdev/mdev_type")")
        if ! recognised "$vendor" "$class"; then
            say "$node" Unknown "group=$group mdev=$(basename "$mdev") parent=$addr gpu=$gpu $ids" -- \
                "mediated device of an accelerator this check does not recognise"
        elif [ "$(driver_of "$mdev")" != "vfio_mdev" ] && [ -e "$mdev/driver" ]; then
            say "$node" Fail "group=$group mdev=$(basename "$mdev") parent=$addr gpu=$gpu $ids" -- \
                "mdev bound to $(driver_of "$mdev"), not vfio_mdev"
        else
            say "$node" Pass "group=$group mdev=$(basename "$mdev") parent=$addr gpu=$gpu $ids type=$tname" -- \
                "vGPU (mdev) ready for vfio"
        fi
        return
    fi
    if ! recognised "$vendor" "$class"; then
        say "$node" Unknown "group=$group function=$addr gpu=$gpu $ids driver=${drv:-none}" -- \
            "accelerator not recognised by this check"
        return
    fi
    case "$drv" in
        vfio-pci)
            say "$node" Pass "group=$group function=$addr gpu=$gpu $ids driver=vfio-pci" -- "bound to vfio-pci" ;;
        nvidia)
            vt=$(readf "$dir/nvidia/current_vgpu_type")
            if [ -n "$vt" ] && [ "$vt" != "0" ]; then
                say "$node" Pass "group=$group function=$addr gpu=$gpu $ids driver=nvidia vgpu_type=$vt" -- \
                    "vGPU on a VF (NVIDIA vendor-specific VFIO)"
            else
                say "$node" Fail "group=$group function=$addr gpu=$gpu $ids driver=nvidia" -- \
                    "bound to nvidia without a vGPU type: not usable through vfio"
            fi ;;
        *)
            say "$node" Fail "group=$group function=$addr gpu=$gpu $ids driver=${drv:-none}" -- \
                "bound to ${drv:-no driver}, not vfio-pci" ;;
    esac
}

check_group_node() { # path
    node=$1
    name=$(basename "$node")
    path=$node
    if [ "$name" = "vfio" ]; then
        if [ -e "$path" ]; then
            say "$node" Pass "container=$name" -- "vfio container device present"
        else
            say "$node" Fail "container=$name" -- "vfio container device missing"
        fi
        return
    fi
    case "$name" in
        ''|*[!0-9]*) say "$node" Unknown "path=$node" -- "not a vfio group device node"; return ;;
    esac
    if [ ! -e "$path" ]; then
        say "$node" Fail "group=$name" -- "device node missing"
        return
    fi
    members="$SYS/kernel/iommu_groups/$name/devices"
    if [ ! -d "$members" ]; then
        say "$node" Fail "group=$name" -- "IOMMU group $name unknown to sysfs"
        return
    fi
    ACCEL=1
    before=$((PASSES + FAILS + UNKNOWNS))
    for m in "$members"/*; do
        [ -e "$m" ] || continue
        real=$(cd "$m" && pwd -P)
        if [ -e "$real/mdev_type" ]; then
            check_function "$node" "$name" "$(cd "$real/.." && pwd -P)" "$real"
        else
            check_function "$node" "$name" "$real"
        fi
    done
    if [ $((PASSES + FAILS + UNKNOWNS)) -eq "$before" ]; then
        say "$node" Fail "group=$name" -- "IOMMU group $name holds no accelerator"
    fi
}

check_guest_gpus() { # NVIDIA GPUs seen as PCI devices (inside a VM)
    found=0
    for d in "$SYS"/bus/pci/devices/*; do
        [ -e "$d" ] || continue
        vendor=$(readf "$d/vendor")
        class=$(readf "$d/class")
        recognised "$vendor" "$class" || continue
        found=1
        addr=$(basename "$d")
        drv=$(driver_of "$d")
        ids="id=${vendor#0x}:$(readf "$d/device" | sed 's/^0x//') class=$class"
        if [ "$drv" != "nvidia" ]; then
            say "$addr" Fail "function=$addr $ids driver=${drv:-none}" -- "GPU without its driver"
            continue
        fi
        nvidia_smi_lists "$addr"
        case $? in
            0) say "$addr" Pass "function=$addr $ids driver=nvidia nvidia_smi=listed" -- "nvidia-smi lists the GPU" ;;
            2) say "$addr" Pass "function=$addr $ids driver=nvidia nvidia_smi=absent" -- \
                   "driver bound (nvidia-smi not installed)" ;;
            *) say "$addr" Fail "function=$addr $ids driver=nvidia nvidia_smi=missing" -- "nvidia-smi does not list the GPU" ;;
        esac
    done
    return $((1 - found))
}

if [ $# -eq 0 ] && [ -n "$VGPUCTL_HC_DEVICES" ]; then
    # shellcheck disable=SC2086
    set -- $VGPUCTL_HC_DEVICES
fi
if [ $# -eq 0 ]; then
    for n in "$VFIO"/*; do
        case "$(basename "$n")" in ''|*[!0-9]*) ;; *) set -- "$@" "$n" ;; esac
    done
    [ $# -gt 0 ] && [ -e "$VFIO/vfio" ] && set -- "$VFIO/vfio" "$@"
fi

if [ $# -gt 0 ]; then
    for n in "$@"; do check_group_node "$n"; done
elif check_guest_gpus; then
    # a GPU the container can open (the guest driver's /dev/nvidiaN), not merely one sysfs lists:
    # a container sees the host's PCI devices in /sys whether or not it was given any
    for n in "$DEV"/nvidia[0-9]*; do [ -e "$n" ] && ACCEL=1; done
else
    say "-" Fail "devices=0" -- "no accelerator device given or found"
fi

if command -v nvidia-smi >/dev/null 2>&1; then
    echo "INFO nvidia-smi present"
else
    echo "INFO nvidia-smi absent"
fi

# the markers of kubernetes-sigs/ai-conformance's probe (test/ai_conformance_test.go), then the verdict
if [ "$ACCEL" -eq 1 ]; then
    echo "RESULT: ACCELERATOR_FOUND"
else
    echo "RESULT: ACCELERATOR_MISSING"
fi
if [ "$FAILS" -gt 0 ]; then
    echo "RESULT: Fail"
    exit 1
elif [ "$PASSES" -gt 0 ] && [ "$UNKNOWNS" -eq 0 ]; then
    echo "RESULT: Pass"
else
    echo "RESULT: Unknown"
fi
exit 0
'''


@dataclass
class Finding:
    device: str
    result: str
    fields: dict[str, str] = field(default_factory=dict)
    text: str = ""


@dataclass
class HealthResult:
    result: str  # Pass | Fail | Unknown
    findings: list[Finding] = field(default_factory=list)
    output: str = ""
    exit_code: int | None = None
    accelerator: bool | None = None  # ai-conformance's ACCELERATOR_FOUND / _MISSING marker (None: not printed)

    @property
    def gpus(self) -> set[str]:
        """The physical GPUs (PCI addresses) the checked devices belong to."""
        return {f.fields["gpu"] for f in self.findings if f.fields.get("gpu")}

    @property
    def groups(self) -> set[int]:
        return {int(f.fields["group"]) for f in self.findings if f.fields.get("group", "").isdigit()}

    def summary(self) -> str:
        bad = [f for f in self.findings if f.result != "Pass"]
        return self.result + (": " + "; ".join(f"{f.device}: {f.text}" for f in bad) if bad else "")

    def to_dict(self) -> dict:
        return {"result": self.result, "exit_code": self.exit_code,
                "findings": [{"device": f.device, "result": f.result, **f.fields, "text": f.text}
                             for f in self.findings]}


_CHECK = re.compile(r"^CHECK (\S+) (Pass|Fail|Unknown) (.*?)(?: -- (.*))?$")


def parse(output: str, exit_code: int | None = None) -> HealthResult:
    """The script's output as findings; without a ``RESULT:`` line (the script did not finish) it is a Fail."""
    findings = []
    result = None
    accelerator = None
    for line in output.splitlines():
        m = _CHECK.match(line.strip())
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group(3).split() if "=" in kv)
            findings.append(Finding(m.group(1), m.group(2), fields, m.group(4) or ""))
        elif line.startswith("RESULT: "):
            value = line.split(":", 1)[1].strip()
            if value in MARKERS:
                accelerator = value == MARKERS[0]
            else:
                result = value
    if result not in RESULTS:
        result = "Fail"
        findings.append(Finding("-", "Fail", {}, "the health check did not report a result"))
    return HealthResult(result=result, findings=findings, output=output, exit_code=exit_code, accelerator=accelerator)


def script_path(directory: str | Path) -> Path:
    """Write the script into ``directory`` (executable) and return its path."""
    p = Path(directory) / "healthcheck.sh"
    p.write_text(SCRIPT)
    p.chmod(0o755)
    return p


def run(devices: list[str], *, sys_root: str | Path | None = None, timeout: float = 60.0,
        env: dict | None = None) -> HealthResult:
    """Run the script with ``sh`` on ``devices`` (device node paths); ``sys_root`` replaces /sys."""
    full_env = dict(os.environ, **(env or {}))
    if sys_root is not None:
        full_env["VGPUCTL_HC_SYS"] = str(sys_root)
    with tempfile.TemporaryDirectory(prefix="vgpuctl-hc-") as tmp:
        try:
            p = subprocess.run(["sh", str(script_path(tmp)), *map(str, devices)], capture_output=True,
                               text=True, timeout=timeout, env=full_env)
        except subprocess.TimeoutExpired:
            return HealthResult("Fail", [Finding("-", "Fail", {}, f"timed out after {timeout}s")])
    return parse(p.stdout + p.stderr, p.returncode)


def main(argv: list[str] | None = None) -> int:
    """``python -m dra_bridge.conformance.healthcheck --print`` prints the script; otherwise runs it on argv."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--print"]:
        sys.stdout.write(SCRIPT)
        return 0
    res = run(argv)
    sys.stdout.write(res.output)
    return 1 if res.result == "Fail" else 0


if __name__ == "__main__":
    sys.exit(main())

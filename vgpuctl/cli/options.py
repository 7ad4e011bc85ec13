"""One definition of each option that several commands share, with one meaning everywhere.

* ``-o/--output``: ``table`` (the default, for people), ``wide`` where a table has more columns,
  ``json`` and ``yaml`` for machines; ``--json`` stays as a hidden alias of ``-o json``.
* ``--kubeconfig [FILE]`` and ``--context NAME``: the cluster, found in kubectl's order (the flag,
  ``$KUBECONFIG``, ``~/.kube/config``, in-cluster); for a command that can also work without a
  cluster, giving either flag is what makes it read one.
* ``--server-version``: one rule for its default: with a cluster, the server's own version; without
  one, :data:`dra_bridge.api.compat.DEFAULT_VERSION`.
* ``--feature-gates``, ``--driver``, ``--kubelet-root``, ``--node-name``.
* The host options (``--simulate``, ``--sys-root``, ...), accepted before or after the command.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, TypedDict, Unpack

if TYPE_CHECKING:
    from dra_bridge.apiclient.objects import ApiClient

TABLE, WIDE, JSON, YAML = "table", "wide", "json", "yaml"


def add_output(p: argparse.ArgumentParser, *, wide: bool = False, table: bool = True,
               default: str | None = None, what: str = "") -> None:
    """``-o/--output`` (and the hidden ``--json``)."""
    choices = ([TABLE] if table else []) + ([WIDE] if wide else []) + [JSON, YAML]
    default = default or choices[0]
    p.add_argument("-o", "--output", choices=choices, default=default, metavar="|".join(choices),
                   help=f"output format{what} (default {default})")
    p.add_argument("--json", dest="output", action="store_const", const=JSON, help=argparse.SUPPRESS)


def add_kubeconfig(p: argparse.ArgumentParser, what: str = "read the cluster", *,
                   group: argparse._MutuallyExclusiveGroup | None = None) -> None:
    """``--kubeconfig [FILE]`` and ``--context``: which cluster, in kubectl's search order."""
    target = group if group is not None else p
    target.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE",
                        help=f"{what}: FILE, or (flag without a value) $KUBECONFIG, ~/.kube/config, then the "
                             "in-cluster service account, as kubectl looks")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context to use (default: its current-context)")


def reads_cluster(args: argparse.Namespace, *, env: bool = False) -> bool:
    """Whether the command was asked to read a cluster (``--kubeconfig`` or ``--context`` given; with
    ``env``, a set ``$KUBECONFIG`` too, as kubectl reads it: a command that works without a cluster
    but exists to read one)."""
    return (getattr(args, "kubeconfig", None) is not None or getattr(args, "context", None) is not None
            or (env and bool(os.environ.get("KUBECONFIG"))))


def connect(args: argparse.Namespace, timeout: float | None = None) -> ApiClient:
    """The cluster's API client, known to answer (bad kubeconfig or no answer: one-line errors)."""
    # the kubernetes client (~0.9 s): only for a command that reads a cluster
    from dra_bridge.apiclient.client import PROBE_TIMEOUT
    from dra_bridge.apiclient.client import connect as _connect

    return _connect(args.kubeconfig or None, context=args.context, timeout=timeout or PROBE_TIMEOUT)


class BadOption(Exception):
    """An option's value that is bad input: one line, exit 2, never argparse's usage. (Not a
    ``ValueError``: argparse turns those, raised by a ``type``, into its usage message.)"""

    exit_code = 2


def _server_version(text: str) -> str:
    from dra_bridge.api.compat import VERSION_CHOICES  # start-up: not for -h

    if text not in VERSION_CHOICES:
        raise BadOption(f"--server-version {text}: not a Kubernetes version vgpuctl knows; use one of "
                        f"{', '.join(VERSION_CHOICES)}")
    return text


def add_server_version(p: argparse.ArgumentParser, what: str = "the API server the output is for", *,
                       from_cluster: bool = False) -> None:
    """``--server-version``: with ``from_cluster`` (a command that always reads one) the default is
    the server's own version, else :data:`DEFAULT_VERSION`."""
    from dra_bridge.api.compat import DEFAULT_VERSION, VERSION_CHOICES, format_version  # start-up: not for -h

    default = None if from_cluster else format_version(DEFAULT_VERSION)
    p.add_argument("--server-version", type=_server_version, choices=VERSION_CHOICES, default=default,
                   metavar="|".join(VERSION_CHOICES),
                   help=f"Kubernetes version of {what} (default: "
                        + ("the server's own)" if from_cluster else f"{default}; with --kubeconfig the cluster's)"))


def add_feature_gates(p: argparse.ArgumentParser) -> None:
    p.add_argument("--feature-gates", default="", metavar="NAME=true|false,...",
                   help="the API server's feature gates over that version's defaults, e.g. "
                        "DRADeviceCompatibilityGroups=true (default: none, the version's defaults)")


def add_driver(p: argparse.ArgumentParser, what: str = "DRA driver name") -> None:
    from dra_bridge.api import DEFAULT_DRIVER  # the package alone: names.py costs more at -h

    p.add_argument("--driver", default=DEFAULT_DRIVER, help=f"{what} (default %(default)s)")


def add_kubelet_root(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--kubelet-root", default=None, metavar="DIR",
                   help="kubelet directory" + (f" ({what})" if what else "") + "; the DRA driver keeps its "
                        "checkpoint of prepared claims in <DIR>/plugins/<driver>/ (default /var/lib/kubelet; with "
                        "--simulate, <simulated host dir>/kubelet, where vgpuctl --simulate serve keeps it). The GPU "
                        "numbering is the node's, in /var/lib/vgpuctl/gpu-ids.json; an earlier release's "
                        "<DIR>/plugins/<driver>/gpu-ids.json counts where the node has none")


def add_node_name(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", default=None, help="node name (default: $NODE_NAME, or the simulated host's node)")


#: Host options: valued ones are skipped when looking for the command name in argv.
HOST_VALUED = ("--simulate", "--sim-dir", "--sys-root", "--dev-root", "--mdevctl-root", "--state-root",
               "--libvirt-uri")


#: host options that name a real host's directories: a simulated host has its own (under --sim-dir)
REAL_HOST_PATHS = ("--sys-root", "--dev-root", "--mdevctl-root", "--state-root")


def check_host_options(args: argparse.Namespace) -> None:
    """``--simulate`` with a real host's path option: refused in one line, never silently ignored."""
    if not getattr(args, "simulate", None):
        return
    given = [o for o in REAL_HOST_PATHS if getattr(args, o[2:].replace("-", "_"), None)]
    if given:
        raise BadOption(f"{given[0]} with --simulate: the simulated host keeps its own sysfs, /dev, mdevctl "
                        "definitions and state under its directory, so this option would be ignored; drop it, or "
                        "choose where the simulated host lives with --sim-dir DIR")


class _Suppressed(TypedDict, total=False):
    default: str


class _HostOption(TypedDict, total=False):
    """The ``add_argument`` keywords the host options use."""

    action: str
    nargs: str
    const: str
    metavar: str


def add_host_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """Which host to work on. Given to the top parser and (``suppress``: no default, so a value
    given before the command is kept; no help, ``vgpuctl -h`` lists them) to every command's parser,
    so they go before or after the command."""
    d: _Suppressed = {"default": argparse.SUPPRESS} if suppress else {}

    def add(*names: str, help: str, **kw: Unpack[_HostOption]) -> None:
        p.add_argument(*names, **kw, **d, help=argparse.SUPPRESS if suppress else help)

    add("--simulate", nargs="?", const="default", metavar="PRESET|HOST.yaml",
        help="run against a simulated host (state kept between commands; preset default: default; "
             "needs pip install 'vgpuctl[sim]')")
    add("--sim-dir", help="where the simulated host lives (default ~/.local/state/vgpuctl/sim/<name>, "
                          "or $VGPUCTL_SIM_DIR/<name>)")
    add("--sys-root", help="sysfs root (default /sys)")
    add("--dev-root", help="/dev root (default /dev)")
    add("--mdevctl-root", help="mdevctl definitions (default /etc/mdevctl.d)")
    add("--state-root", help="vgpuctl state (default /var/lib/vgpuctl)")
    add("--libvirt-uri", help="libvirt URI to check for devices in use (e.g. qemu:///system)")
    add("--debug", action="store_true", help="on an error, show the Python traceback")

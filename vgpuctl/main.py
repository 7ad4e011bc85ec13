"""``vgpuctl``: the composition root. Nothing imports this package; it imports what a command needs.

Command modules are imported by name only for the command being run, so ``vgpuctl discover`` or
``vgpuctl plan`` load neither ``grpc`` nor ``kubernetes``. A module serves a command either with
``add_<command>(parser)`` (which sets ``func``) or with ``add_arguments(parser)`` and ``run(args)``.

Errors end here, in :func:`main`, as one line (a layout's problems one per line): bad input (a
``ValueError``: ConfigError, RenderError, YamlFileError, a kubeconfig that cannot be used, ...)
exits 2; an operational failure (an ``OSError``: a failing host read, a full or read-only disk,
each naming its path) and anything unexpected exit 1; ``--debug`` lets it raise with its
traceback instead. A reader that
closed stdout early (``vgpuctl discover | head -1``) ends the command quietly with 141, what a
shell reports for a tool killed by SIGPIPE (128 + 13).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import select
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from vgpuctl import __version__
from vgpuctl.cli.extras import require_sim
from vgpuctl.cli.options import HOST_VALUED, add_host_options, check_host_options
from vgpuctl.cli.signals import take_interrupts

if TYPE_CHECKING:
    from pydantic import ValidationError


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    description: str | None = None


COMMANDS: dict[str, Command] = {
    "discover": Command("vgpuctl.commands.node", "show GPUs, vGPU types and vGPUs"),
    "plan": Command("vgpuctl.commands.node", "print what apply would change, per GPU (-v: every step)"),
    "apply": Command("vgpuctl.commands.node", "make the node match a layout"),
    "restore": Command("vgpuctl.commands.node", "re-create saved vGPUs that are missing (after a reboot)"),
    "list": Command("vgpuctl.commands.list", "list the node's vGPUs, active or defined, and who holds each",
                    "As mdevctl list (active) and mdevctl list --defined (persisted), with their holders: processes "
                    "holding their /dev/vfio group or cdev, libvirt domains, prepared DRA claims."),
    "serve": Command("vgpuctl.commands.serve",
                     "run the node agent: reconcile, publish ResourceSlices, serve the kubelet"),
    "slices": Command("vgpuctl.commands.slices", "print the ResourceSlices this node would publish (writes nothing)"),
    "render": Command("vgpuctl.commands.render", "print KubeVirt and DRA objects (VMs, claims, DeviceClasses, ...)"),
    "demo": Command("vgpuctl.commands.demo", "run the whole system on a simulated cluster (no cluster, no GPU, seconds)",
                    "A simulated GPU node, the node manager, the DRA bridge publishing to an in-process API, VMs and "
                    "a pod claiming vGPUs and whole GPUs, torn down again."),
    "capacity": Command("vgpuctl.commands.capacity",
                        "how many more vGPUs of each profile (or whole GPUs) fit, per node and GPU",
                        "Reads ResourceSlices and ResourceClaims from a cluster (--kubeconfig) or a file of "
                        "objects (--from); with --simulate, the simulated node's slices and prepared claims; "
                        "without any, the demo's simulated example cluster with its made-up workloads (said "
                        "in the first line)."),
    "conformance": Command("vgpuctl.commands.conformance",
                           "run the KAR-0003/KAR-0004 conformance checks (simulated cluster by default)",
                           "Five checks of GPU sharing through DRA; against the simulated cluster unless "
                           "--kubeconfig or --context is given or $KUBECONFIG is set: then against that cluster, "
                           "where it creates a namespace for its workloads and deletes it at the end. Prints a "
                           "table (-o json, yaml); --junit FILE also writes JUnit XML."),
    "doctor": Command("vgpuctl.commands.doctor", "check a cluster for the DRA bridge: PASS / WARN / FAIL with fixes",
                      "Reads the API server (its version, and which DRA fields it keeps, found by a dry-run "
                      "ResourceSlice), KubeVirt's CR, the DeviceClasses and each GPU node's agent state. Exit 0 "
                      "when nothing failed, 1 when a check failed."),
    "nvml-probe": Command("vgpuctl.commands.nvmlprobe", "record what NVIDIA's driver reports for each GPU (read-only)"),
    "sim": Command("vgpuctl.commands.sim", "simulated hosts and the local Kubernetes API server"),
    "cordon": Command("vgpuctl.commands.cordon", "take a GPU (NODE/GPU) or a node's GPUs out of new allocations",
                      "Through DRA device taints where the API server keeps them, else by withdrawing the GPU's "
                      "free devices; what runs there keeps running (with --effect NoExecute and taints, the "
                      "cluster evicts what does not tolerate it). Exit 3 while the node agent has not "
                      "republished the GPUs."),
    "drain": Command("vgpuctl.commands.cordon", "cordon a GPU or node, then wait for its holders to go",
                     "Lists the claims, pods and VMs holding the GPUs (with the VMs' live-migration state), "
                     "evicts pods only with --evict, waits up to --timeout; never touches a device in use. "
                     "Exit 0 drained, 3 holders remain."),
    "uncordon": Command("vgpuctl.commands.cordon", "put a cordoned GPU or node back into service"),
    "gpus": Command("vgpuctl.commands.kubectl_plugin", "the cluster's GPUs: what they offer, cordon, holders, free capacity",
                    "Per node and GPU: what it publishes, whether it is cordoned, which claims, pods and VMs hold "
                    "it (vGPU placements) and how many more of each profile fit. kubectl vgpu shows the same."),
    "completion": Command("vgpuctl.commands.completion", "print a bash or zsh completion script",
                          "Generated from the command-line parser: source <(vgpuctl completion bash)."),
}

#: commands that run only on the simulators (the [sim] extra)
SIM_COMMANDS = ("demo", "sim")

#: ``kubectl vgpu``'s commands: kubectl runs the ``kubectl-vgpu`` executable (:func:`kubectl_plugin`)
#: with the arguments after ``vgpu``; without a command, ``get``.
PLUGIN_COMMANDS: dict[str, Command] = {
    "get": Command("vgpuctl.commands.kubectl_plugin", "the cluster's GPUs: what they offer, cordon, holders, free capacity "
                   "(the default)", COMMANDS["gpus"].description),
    **{name: COMMANDS[name] for name in ("cordon", "drain", "uncordon", "completion")},
}
PLUGIN_DESCRIPTION = "GPUs shared by KubeVirt VMs and pods through DRA (vgpuctl), per node and GPU"


def version() -> str:
    """vgpuctl's version: ``vgpuctl.__version__``, which pyproject.toml reads too (one place, and no
    ``importlib.metadata`` at start-up: it costs more than the rest of ``--version``)."""
    return __version__


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help, unless the text already says it or there is none to say
    (None, a flag's False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default in (None, False, "", [], argparse.SUPPRESS)
                or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """vgpuctl's parser: its subcommands' parsers (made with this class) show defaults too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # argparse.ArgumentParser's own
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _global_options(p: argparse.ArgumentParser, host: bool = True) -> None:
    p.add_argument("--version", action="version", version=f"vgpuctl {version()}",
                   help="print vgpuctl's version and exit")
    if host:
        add_host_options(p)
    else:  # kubectl vgpu: a cluster's view, no host to name
        p.add_argument("--debug", action="store_true", help="on an error, show the Python traceback")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="more detail: debug logs, and every step of plan and apply")


def _command_of(argv: list[str], commands: dict[str, Command] = COMMANDS) -> str | None:
    """The first argument naming a command, skipping global options and their values."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in HOST_VALUED:
            skip = True
        elif a in commands:
            return a
        elif not a.startswith("-"):
            return None  # a value where a command belongs: argparse says what is wrong
    return None


DESCRIPTION = "vGPU and GPU passthrough manager for KubeVirt nodes"


def build_parser(command: str | None = None, *, prog: str = "vgpuctl", commands: dict[str, Command] = COMMANDS,
                 description: str = DESCRIPTION, every: bool = False) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only (every command is listed in ``-h``);
    ``every``: with every command's arguments (shell completion reads them)."""
    p = Parser(prog=prog, description=description)
    _global_options(p, host=commands is COMMANDS)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, c in commands.items():
        module = importlib.import_module(c.module) if name == command or every else None
        sp = sub.add_parser(name, help=c.help, description=c.description or c.help[:1].upper() + c.help[1:])
        if module is not None:
            add_host_options(sp, suppress=True)
            adder = getattr(module, f"add_{name}", None)
            if adder is not None:
                adder(sp)
            else:
                module.add_arguments(sp)
                sp.set_defaults(func=module.run)
    return p


def _fix_simulate(argv: list[str], commands: dict[str, Command] = COMMANDS) -> list[str]:
    """``--simulate discover`` means the default preset, not a preset named discover."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--simulate" and (i + 1 == len(out) or out[i + 1] in commands or out[i + 1].startswith("-")):
            out[i] = "--simulate=default"
    return out


# 128 + SIGPIPE: what a shell reports for a tool the signal ended (bash(1), EXIT STATUS), so
# `set -o pipefail` scripts see vgpuctl as they see `yes | head -1`
SIGPIPE_EXIT = 141


def error_lines(exc: BaseException) -> list[str]:
    """What the user is told about ``exc``: one line (a rejected layout: one per problem)."""
    from mdev_manager.config import ConfigError, ConfigFileError  # start-up cost (~35 ms): on an error only

    api = _api_error(exc)
    if api is not None:
        return [f"error: {api}"]
    if isinstance(exc, ConfigFileError):
        return [f"error: {_one_line(str(exc))}"]
    if isinstance(exc, ConfigError):
        where = f"{exc.source}: " if exc.source else ""
        return [f"error: {where}the layout was rejected; nothing was changed:"] + [f"  - {p}" for p in exc.problems]
    if isinstance(exc, OSError):
        if type(exc).__str__ is not OSError.__str__ or isinstance(exc, FileExistsError):
            return [f"error: {_one_line(str(exc))}"]  # it words itself (a failing host read)
        if exc.strerror and exc.filename:
            hint = _OS_HINTS.get(exc.errno or 0)
            return [f"error: {exc.filename}: {exc.strerror}" + (f" ({hint})" if hint else "")]
    if _is_validation_error(exc):
        problems = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return [f"error: {exc.title}: " + "; ".join(problems)]
    if isinstance(exc, (ValueError, KeyError)) or isinstance(getattr(exc, "exit_code", None), int):
        return [f"error: {_one_line(str(exc))}"]
    text = _one_line(str(exc))
    return [f"error: {type(exc).__name__}{': ' + text if text else ''} (an unexpected error; "
            "run with --debug for the traceback)"]


#: what to do about an operational failure, by errno
_OS_HINTS = {
    errno.ENOSPC: "free space on that filesystem, then run the command again: what was written before stays",
    errno.EDQUOT: "the disk quota is used up; free space, then run the command again",
    errno.EROFS: "the filesystem is read-only: remount it read-write, then run the command again",
    errno.EIO: "an I/O error: check the disk and the kernel log (dmesg)",
    errno.EACCES: "permission denied: run as root, or with write access to that path",
    errno.EPERM: "operation not permitted: run as root",
}


def exit_code(exc: BaseException) -> int:
    """2 for bad input (a file, value or option to fix); 1 for a failure of the node or the system
    (a full or read-only disk, an I/O error) and for anything unexpected; an error that names its
    own (``exit_code``: 3, a node not yet at its layout) keeps it."""
    own = getattr(exc, "exit_code", None)
    if isinstance(own, int):
        return own
    if isinstance(exc, OSError):
        return 1
    if isinstance(exc, (ValueError, KeyError)) or _is_validation_error(exc):
        return 2
    return 1


def _api_error(exc: BaseException) -> str | None:
    """An API server's answer or a dead connection to it, in one line (the client's own ``str`` dumps
    headers and bodies): ``the API server answered 404 NotFound: configmaps "x" not found``."""
    if not {"kubernetes", "urllib3", "dra_bridge.apiclient.errors"} & sys.modules.keys():
        return None  # none loaded: no such error can have happened
    from dra_bridge.apiclient.errors import brief, is_api_error  # start-up: only on an error

    if is_api_error(exc):
        return f"the API server answered {brief(exc)}"
    urllib3 = sys.modules.get("urllib3.exceptions")
    if urllib3 is not None and isinstance(exc, urllib3.HTTPError):
        pool = getattr(exc, "pool", None)
        where = f" at {pool.scheme}://{pool.host}:{pool.port}" if pool is not None else ""
        reason = getattr(exc, "reason", None) or exc
        text = _one_line(str(reason)).rsplit(": ", 1)[-1]
        return f"the API server{where} did not answer ({text}); check that it is up and reachable"
    return None


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _is_validation_error(exc: BaseException) -> TypeGuard[ValidationError]:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


def _stdout_closed() -> bool:
    """Whether nothing reads stdout any more (a pipe whose reader exited reports POLLERR)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no fd (captured), or closed
        return False


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not fail again (Python's signal docs,
    "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _needs_sim(command: str | None, argv: list[str]) -> bool:
    return command in SIM_COMMANDS or any(a == "--simulate" or a.startswith("--simulate=") for a in argv)


def main(argv: list[str] | None = None, *, prog: str = "vgpuctl", commands: dict[str, Command] = COMMANDS,
         description: str = DESCRIPTION) -> int:
    """The CLI (``prog`` and ``commands``: the kubectl plugin's own, :mod:`vgpuctl.commands.kubectl_plugin`)."""
    take_interrupts()  # first: a SIGINT is taken the same way from here on (vgpuctl.cli.signals)
    argv = _fix_simulate(sys.argv[1:] if argv is None else argv, commands)  # before _command_of reads it
    debug = "--debug" in argv  # known before parsing, which may fail too
    try:
        command = _command_of(argv, commands)
        if _needs_sim(command, argv) and not ({"-h", "--help", "--version"} & set(argv)):
            require_sim(f"vgpuctl {command}" if command in SIM_COMMANDS else "--simulate")
        args = build_parser(command, prog=prog, commands=commands, description=description).parse_args(argv)
        # every command's arguments, for `completion` (a command module cannot import this one)
        args.full_parser = lambda: build_parser(prog=prog, commands=commands, description=description, every=True)
        check_host_options(args)
        if getattr(args, "simulate", None):
            from vgpuctl.cli.simhost import open_simulated  # the simulators, only when asked for

            args.simulated = open_simulated
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        if not args.verbose:  # its "Retrying (...)" line per attempt: the error that follows says it once
            logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except SystemExit:  # argparse: after -h, or a usage error
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _drop_stdout()
            return SIGPIPE_EXIT
        raise
    except BrokenPipeError as exc:
        if not _stdout_closed():  # a socket, not our reader
            if debug:
                raise
            print(error_lines(exc)[0], file=sys.stderr)
            return 1
        _drop_stdout()
        return SIGPIPE_EXIT
    except KeyboardInterrupt:
        if debug:
            raise
        return 130  # 128 + SIGINT
    except Exception as exc:  # noqa: BLE001 - the CLI's edge: everything ends as one line
        if debug:
            raise
        for line in error_lines(exc):
            print(line, file=sys.stderr)
        return exit_code(exc)


def kubectl_plugin(argv: list[str] | None = None) -> int:
    """``kubectl-vgpu``: ``kubectl vgpu [get] ...``, ``kubectl vgpu cordon ...`` (kubectl passes none of
    its flags on: ``--kubeconfig``, ``--context`` and ``-n`` are the plugin's own, as kubectl's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in PLUGIN_COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["get", *argv]
    return main(argv, prog="kubectl vgpu", commands=PLUGIN_COMMANDS, description=PLUGIN_DESCRIPTION)


def kubectl_plugin_complete(argv: list[str] | None = None) -> int:
    """``kubectl_complete-vgpu``: kubectl (1.26+) runs it for ``kubectl vgpu <TAB>`` with the words typed
    after ``vgpu``; it answers as cobra's ``__complete`` does: one candidate a line, then ``:<directive>``
    (4: no file names, 0: the shell's default)."""
    from vgpuctl.commands.completion import complete, tree

    words = list(sys.argv[1:] if argv is None else argv) or [""]
    root = tree(build_parser(prog="kubectl vgpu", commands=PLUGIN_COMMANDS, description=PLUGIN_DESCRIPTION,
                             every=True))
    candidates, files = complete(root, words)
    print("\n".join([*candidates, f":{0 if files else 4}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

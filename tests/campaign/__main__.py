"""``python -m tests.campaign --steps N --seed S``: a longer run of the node-safety campaign."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path


def missing_test_extra() -> str | None:
    """The one-line error when the campaign cannot run here (hypothesis and the simulators: the test
    extra), else None. The mutations command says the same before it copies anything."""
    try:
        import tests.campaign.run  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("tests", "vgpuctl", "mdev_manager", "dra_bridge", "kubevirt_templates"):
            raise
        return (f"error: the campaign needs the test extra ({exc.name} is not installed): .venv/bin/pip install -c "
                ".ci/constraints.txt -e '.[test,libvirt]' (or bash .ci/run, which makes that .venv)")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="steps to run in all")
    p.add_argument("--seed", type=int, action="append", help="hypothesis seed (repeat for several runs)")
    p.add_argument("--episode-steps", type=int, default=50, help="steps per fresh node")
    p.add_argument("--no-shrink", action="store_true", help="report the first failing sequence as found")
    p.add_argument("--uevent-faults", dest="uevent_faults", action="store_true", default=True,
                   help="draw the uevent fault steps (lost, duplicated, reordered, storms; #37.5): the default")
    p.add_argument("--no-uevent-faults", dest="uevent_faults", action="store_false",
                   help="draw no uevent fault steps: every seed draws other steps than in CI")
    p.add_argument("-v", "--verbose", action="store_true", help="show the agent's log (warnings and up)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.episode_steps < 1:
        p.error("--steps and --episode-steps must be at least 1")
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL, format="%(name)s: %(message)s")
    missing = missing_test_extra()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    if (why := _unpinned()) is not None:
        print(why, file=sys.stderr)
        if why.startswith("error:"):
            return 2
    from tests.campaign.run import run
    code = 0
    for s in args.seed or [0]:
        start = time.monotonic()

        def progress(done: int, total: int, s: int = s, start: float = start) -> None:
            if sys.stderr.isatty() or done % 100 == 0 or done == total:
                took = time.monotonic() - start  # the run time, and what is left at this pace
                left = f", about {took / done * (total - done):.0f} s left" if done and done < total else ""
                print(f"\rseed {s}: {done}/{total} steps, {took:.0f} s{left}  ", end="" if sys.stderr.isatty() else "\n",
                      file=sys.stderr, flush=True)

        res = run(args.steps, s, episode_steps=args.episode_steps, shrink=not args.no_shrink, progress=progress,
                  uevents=args.uevent_faults)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(res.kinds.items()))
        print(f"seed {s}: {res.episodes} nodes, {res.seconds:.0f} s, trace {res.digest}; steps by kind: {kinds}")
        if res.covered:
            print(f"seed {s}: " + ", ".join(f"{k} {n}" for k, n in sorted(res.covered.items())))
        if res.failure:
            print(f"first violation after step {res.failed_at} of the run:")
            print(res.failure)
            code = 1
        print(res.line)
    return code


def _unpinned() -> str | None:
    """What keeps a seed from meaning the steps it means in CI: libvirt-python missing (an error: the
    campaign's libvirt domains are read through it, as the node reads them), or a hypothesis other
    than the one .ci/constraints.txt pins (a note: the draws, so the steps, are another sequence)."""
    import hypothesis

    try:
        import libvirt  # noqa: F401
    except ImportError as exc:
        return (f"error: the campaign needs libvirt-python ({exc}), the libvirt extra: .venv/bin/pip install -c "
                ".ci/constraints.txt -e '.[test,libvirt]' (or bash .ci/run, which makes that .venv)")
    pins = Path(__file__).resolve().parents[2] / ".ci" / "constraints.txt"
    pinned = re.search(r"^hypothesis==(\S+)", pins.read_text(), re.M) if pins.is_file() else None
    if pinned and pinned[1] != hypothesis.__version__:
        return (f"note: hypothesis {hypothesis.__version__} is installed, .ci/constraints.txt pins {pinned[1]}: a seed "
                "draws other steps than in CI")
    return None


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tests.campaign.mutations``: prove the campaign by mutation.

Each mutation breaks one rule of the node-safety contract with a small patch, in a scratch copy
of the repository (the files git tracks or would track, copied into a temporary directory; never
this checkout, never committed). The campaign then runs there (``--seed 1 --steps 300`` by default,
no shrinking) and this prints, per mutation, the step of the run after which the first violation
was seen, and that violation.

The scratch baseline first gets the fixes of :data:`tests.campaign.known.KNOWN`: real bugs the
campaign finds in the code as it is, fixed in the scratch copy only, so that the baseline passes
and each mutation is measured against a campaign that otherwise stays green. A fix whose text is
no longer in the code has landed (or the code moved): it is skipped, saying so. A mutation may also
be the inverse of one of them (``unfix``): the code as it was before that fix.

``--ci`` runs each of the mutations CI must catch (overlap, lock, in-use, libvirt holders) with CI's parameters
(tests/system/test_campaign.py: its seeds and steps) instead, and says whether every seed caught it.
At most two campaign processes run at once (``-j``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.campaign.known import KNOWN, Patch

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    key: str
    what: str
    patches: tuple[Patch, ...] = ()
    unfix: str | None = None  # the mutation is "this fix not applied": the code as it is today


@dataclass
class Outcome:
    key: str
    what: str
    step: int | None = None  # step of the run after which the first violation was seen; None: none in the run
    violation: str = ""
    seconds: float = 0.0
    note: str = ""
    per_seed: dict[int, int | None] = field(default_factory=dict)


# --------------------------------------------------------------------------- the mutations

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("a", "in-use check disabled (a vGPU's users are never asked)", (
        Patch("mdev_manager/vgpusteps.py",
              "def vgpu_users(v: Vgpu, usage: Usage) -> list[str]:\n",
              "def vgpu_users(v: Vgpu, usage: Usage) -> list[str]:\n    return []  # MUTATION (a)\n"),)),
    Mutation("b", "overlap refusal removed (two claims on one device)", (
        Patch("dra_bridge/kubeletplugin/overlap.py",
              '    held = [_Held(_owner(rec), d.pool, d.device, d.kind, d.gpu, _record_span(d))\n',
              '    return None  # MUTATION (b)\n'
              '    held = [_Held(_owner(rec), d.pool, d.device, d.kind, d.gpu, _record_span(d))\n'),)),
    Mutation("c", "node lock a no-op", (
        Patch("mdev_manager/host/lock.py",
              '        caller waits for."""\n',
              '        caller waits for."""\n'
              '        yield  # MUTATION (c)\n        return\n'),)),
    Mutation("d", "boot-id check always true (a record of an earlier boot is taken as this boot's)", (
        Patch("dra_bridge/kubeletplugin/driver.py",
              "        if boot is None or rec.boot_id == boot:\n            return True\n",
              "        if True:  # MUTATION (d)\n            return True\n"),
        Patch("dra_bridge/kubeletplugin/refcheck.py",
              "    return boot is None or rec.boot_id is None or rec.boot_id == boot\n",
              "    return True  # MUTATION (d)\n"))),
    Mutation("e", "claim-name checks removed (path safety: names unchecked, paths not contained)", tuple(
        [Patch("dra_bridge/kubeletplugin/paths.py", f"def {fn}(value: object{sig}) -> str:\n",
               f"def {fn}(value: object{sig}) -> str:\n    return value  # MUTATION (e)\n")
         for fn, sig in (("check_uid", ', field: str = "claim uid"'), ("check_namespace", ', field: str = "claim namespace"'),
                         ("check_name", ', field: str = "claim name"'), ("check_label", ", field: str"),
                         ("check_request", ', field: str = "request"'))]
        + [Patch("dra_bridge/kubeletplugin/paths.py",
                 '    """``path`` when it resolves (symlinks followed) to ``root`` or below it, else UnsafeName."""\n',
                 '    """``path`` when it resolves (symlinks followed) to ``root`` or below it, else UnsafeName."""\n'
                 '    return Path(path)  # MUTATION (e)\n')])),
    Mutation("f", "rebuild keeping no claims (a corrupted checkpoint is replaced by an empty one)", (
        Patch("dra_bridge/kubeletplugin/prepared.py",
              "    cp = Checkpoint(claims=out.claims)\n",
              "    cp = Checkpoint(claims={})  # MUTATION (f)\n"),)),
    Mutation("g", "exit 3 reported as 0 (a converging apply says the node matches)", (
        Patch("vgpuctl/commands/node.py",
              "EXIT_CONVERGING if out.blocked else 0)",
              "0 if out.blocked else 0)  # MUTATION (g)"),)),
    Mutation("h", "libvirt holders ignored", (
        Patch("mdev_manager/usage.py",
              "    if uri is None:\n        return LibvirtUse()\n",
              "    return LibvirtUse()  # MUTATION (h)\n"),)),
    Mutation("i", "metadata deleted by name instead of uid", (
        Patch("dra_bridge/kubeletplugin/claimfiles.py",
              "        if uid not in (rec.uid, None) or (uid is None and Path(f).parent.parent.name in namesakes):\n",
              "        if False:  # MUTATION (i)\n"),)),
    Mutation("j", "a MIG-backed vGPU kept because in use loses its GPU instance's record (issue 29)", (
        Patch("mdev_manager/migplan.py",
              "    recorded = kept_ids | {v.id for v in busy if v.id in saved_ids}\n",
              "    recorded = kept_ids  # MUTATION (j)\n"),)),
    # issue 36, point 5: the fixes of issue 29 the campaign did not walk into
    Mutation("k", "the GPU numbering kept only by serve (a hand-run apply numbers GPUs by PCI position)", (
        Patch("vgpuctl/commands/node.py",
              "                                    on_step=on_step, stop=signals.pending, read_back=True, inventory=before)\n",
              "                                    on_step=on_step, stop=signals.pending, read_back=True, inventory=before,\n"
              "                                    ids={})  # MUTATION (k)\n"),
        Patch("vgpuctl/commands/node.py",
              "                before = still_current(env, io, looked, seen) or discover(env, io, node=node)\n",
              "                before = discover(env, io, node=node, ids={})  # MUTATION (k)\n"),)),
    Mutation("l", "reboot placements: a claim of an earlier boot holds no placement or VF until re-created", (
        Patch("dra_bridge/kubeletplugin/driver.py",
              "        taken = self.prepared.recorded_vfs(ref.uid)\n",
              "        taken: set[str] = set()  # MUTATION (l)\n"),
        Patch("dra_bridge/kubeletplugin/overlap.py",
              "    after a reboot could take another's placement).\"\"\"\n",
              "    after a reboot could take another's placement).\"\"\"\n    return None  # MUTATION (l)\n"))),
    Mutation("m", "a GPU off the bus gives up its number (the middle GPU's index moves onto the last)", (
        Patch("mdev_manager/selection.py",
              "    numbers |= {a: n for a, n in inv.gone_numbers.items()",
              "    numbers |= {} and {a: n for a, n in inv.gone_numbers.items()  # MUTATION (m)\n"
              "               "),)),
    Mutation("n", "EEXIST adoption removed (a saved vGPU mdevctl's udev rule made between an apply's look and its "
                  "create fails the apply)", (
        Patch("mdev_manager/executor.py",
              "            if where == (parent, type_id):\n",
              "            if False:  # MUTATION (n)\n"),)),
    Mutation("t", "health taint never set (a faulted GPU's devices published as healthy, #40.4)", (
        Patch("dra_bridge/pool/health.py",
              "    sick = tracker.unhealthy()\n    if not sick:\n",
              "    sick = {}  # MUTATION (t)\n    if not sick:\n"),)),
    Mutation("u", "a held device withdrawn on a fault (the VM's vGPU leaves the slices, #40.4)", (
        Patch("dra_bridge/pool/health.py",
              "        if taints:\n            devices.append(",
              "        if d.name in held:\n            continue  # MUTATION (u)\n"
              "        if taints:\n            devices.append("),)),
    Mutation("v", "binding verdict taken per claim, not per GPU (a round confirms a mix of sizes, #36.2)", (
        Patch("dra_bridge/agent/binder.py",
              "        have = assigned.setdefault(gpu, size) if size is not None else assigned.get(gpu)\n",
              "        have = assigned.get(gpu, size)  # MUTATION (v)\n"),)),
)

#: libvirt holders (h): a libvirt that goes unread (libvirt-python missing, issue 36) removes what its domains name
CI_MUST_CATCH = ("b", "c", "a", "h")


# --------------------------------------------------------------------------- scratch copies


def scratch_copy(dest: Path) -> Path:
    """The files git tracks or would track (untracked but not ignored), copied to ``dest``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def apply(root: Path, patches: tuple[Patch, ...]) -> None:
    for p in patches:
        path = root / p.path
        text = path.read_text()
        if text.count(p.old) != 1:
            raise LookupError(f"{p.path}: the text to patch is there {text.count(p.old)} times, not once")
        path.write_text(text.replace(p.old, p.new))


def applies(root: Path, patches: tuple[Patch, ...]) -> bool:
    return all((root / p.path).read_text().count(p.old) == 1 for p in patches)


# --------------------------------------------------------------------------- running the campaign there


_STEP = re.compile(r"first violation after step (\d+) of the run:\n(.*)", re.S)


def campaign(root: Path, seed: int, steps: int, episode_steps: int, timeout: float) -> tuple[int | None, str, float]:
    """Run the campaign in ``root``: (step of the first violation or None, the violation, seconds)."""
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "tests.campaign", "--seed", str(seed), "--steps", str(steps), "--no-shrink",
           "--episode-steps", str(episode_steps)]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", time.monotonic() - t0
    m = _STEP.search(p.stdout)
    if m:
        lines = [ln.strip() for ln in m.group(2).splitlines() if ln.strip()]
        return int(m.group(1)), " / ".join(lines[:2])[:400], time.monotonic() - t0
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}", time.monotonic() - t0
    return None, "", time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.campaign.mutations", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--episode-steps", type=int, default=50)
    ap.add_argument("--only", help="mutation keys to run, e.g. abc (default: all)")
    ap.add_argument("--ci", action="store_true", help="CI's seeds and steps, the mutations CI must catch")
    ap.add_argument("-j", "--jobs", type=int, default=2, choices=(1, 2), help="campaign processes at once")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per campaign run")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copies (their paths are printed)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without a mutation")
    args = ap.parse_args(argv)
    from tests.campaign.__main__ import missing_test_extra

    missing = missing_test_extra()  # else every campaign run fails alike and each mutation reads "not caught"
    if missing:
        print(missing, file=sys.stderr)
        return 2

    seeds, steps, episode_steps = [args.seed], args.steps, args.episode_steps
    if args.ci:
        from tests.system import test_campaign as ci

        seeds, steps, episode_steps = list(ci.SEEDS), ci.STEPS, ci.EPISODE_STEPS
    chosen = [m for m in MUTATIONS if (args.only is None or m.key in args.only)
              and (not args.ci or m.key in CI_MUST_CATCH)]
    top = Path(tempfile.mkdtemp(prefix="mut", dir="/tmp"))  # short: the campaign's sockets live below it
    try:
        base = scratch_copy(top / "base")
        notes = []
        for key, known in KNOWN.items():
            if applies(base, known.fix):
                apply(base, known.fix)
                notes.append(f"scratch fix {key}: {known.what}")
            else:
                notes.append(f"scratch fix {key}: not applied, its text is gone (landed, or the code moved)")
        print("\n".join(notes), flush=True)

        def copy_for(m: Mutation | None) -> tuple[Path, str]:
            name = m.key if m else "baseline"
            root = top / name
            shutil.copytree(base, root)
            if m is None:
                return root, ""
            if m.unfix is not None:
                patches = KNOWN[m.unfix].fix
                if not applies(ROOT, patches):
                    return root, f"the code no longer has the behaviour ({m.unfix} landed): write mutation ({m.key})"
                for p in patches:  # undo the fix: the code as it is
                    (root / p.path).write_text((root / p.path).read_text().replace(p.new, p.old))
                return root, "the code as it is today"
            apply(root, m.patches)
            return root, ""

        def one(m: Mutation | None) -> Outcome:
            out = Outcome(m.key if m else "-", m.what if m else "baseline (no mutation)")
            root, out.note = copy_for(m)
            if out.note.startswith("the code no longer"):
                return out
            for s in seeds:
                step, violation, secs = campaign(root, s, steps, episode_steps, args.timeout)
                out.per_seed[s] = step
                out.seconds += secs
                if step is not None and out.step is None:
                    out.step, out.violation = step, violation
                elif step is None and violation and not out.violation:
                    out.violation = violation
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
            print(_line(out, seeds), flush=True)
            return out

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, ([] if args.no_baseline else [None]) + chosen))
        print(f"\nseeds {seeds}, {steps} steps each:")
        for r in results:
            print(_line(r, seeds))
        base_ok = args.no_baseline or (results[0].step is None and not results[0].violation)
        mutated = results if args.no_baseline else results[1:]
        caught = all(r.step is not None for r in mutated) and (
            not args.ci or all(all(v is not None for v in r.per_seed.values()) for r in mutated))
        if not args.no_baseline:
            print("baseline passes" if base_ok else "BASELINE FAILS: the mutation steps mean nothing")
        return 0 if base_ok and caught else 1
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
        else:
            print(f"scratch copies kept in {top}")


def _line(r: Outcome, seeds: list[int]) -> str:
    if len(seeds) > 1:
        found = ", ".join(f"seed {s}: {'step ' + str(v) if v is not None else 'not caught'}" for s, v in r.per_seed.items())
    else:
        found = f"step {r.step}" if r.step is not None else "not caught"
    extra = f" [{r.note}]" if r.note else ""
    return f"({r.key}) {r.what}: {found}{extra} ({r.seconds:.0f} s)" + (f"\n      {r.violation}" if r.violation else "")


if __name__ == "__main__":
    sys.exit(main())

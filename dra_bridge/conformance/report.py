"""What a conformance run answers: one result per check, with its evidence, and the cleanup.

Plain data (the CLI renders it as a table, JSON or JUnit XML); the checks are in :mod:`.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TITLES = {
    1: "One physical GPU is exposed as several allocatable logical GPUs",
    2: "Workloads from one ResourceClaimTemplate land on that GPU's node and run on the same physical GPU",
    3: "One logical GPU more than the GPU holds is blocked; nothing running is disturbed",
    4: "vGPU and whole-GPU (vfio) workloads: allocated, isolated and accounted with identical semantics",
    5: "Every workload runs the accelerator health check: Pass, Fail or Unknown (Unknown is not a failure)",
}


class CheckFailed(Exception):
    """A check's property does not hold; the message says which evidence contradicts it."""


@dataclass
class CheckResult:
    number: int
    title: str
    status: str = "skipped"  # passed | failed | error | skipped
    detail: str = ""
    evidence: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"number": self.number, "title": self.title, "status": self.status, "detail": self.detail,
                "evidence": self.evidence, "seconds": round(self.seconds, 3)}


@dataclass
class ConformanceReport:
    cluster: str
    namespace: str
    checks: list[CheckResult]
    cleanup: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.status == "passed" for c in self.checks) and not self.cleanup

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "namespace": self.namespace, "ok": self.ok,
                "checks": [c.to_dict() for c in self.checks], "cleanup": self.cleanup, "seconds": self.seconds}

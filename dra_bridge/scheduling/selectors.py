"""Device selectors: the CEL evaluator the allocator calls for class and request selectors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dra_bridge.scheduling.cel import Selector
    from dra_bridge.scheduling.pools import Device


class Selectors(Protocol):
    def matches(self, expression: str, device: Device) -> bool: ...




class SelectorError(Exception):
    """A selector failed on a device (does not compile, or a runtime error such as an attribute
    read without ``has()``): kube-scheduler fails the pod's scheduling attempt when its search
    reaches that device (upstream ``selectorsMatch``)."""


class CelSelectors:
    """The selector evaluator: the real CEL engine plus Kubernetes' quantity and semver library
    (:mod:`dra_bridge.scheduling.cel`). An expression that does not compile or fails on a device
    raises :class:`SelectorError`, as the scheduler fails the attempt (``strict=False``: the device
    just does not match); the error is kept in ``errors`` either way."""

    def __init__(self, strict: bool = True) -> None:
        # cel imports its own CLI (typer, prompt_toolkit, rich: ~0.2 s), and the allocator, hence the
        # parsers of vgpuctl capacity, conformance and demo, load this module for the Selectors protocol
        from dra_bridge.scheduling.cel import CelError, compile_selector, device_variable

        self._compile, self._variable, self._error = compile_selector, device_variable, CelError
        self._programs: dict[str, Selector] = {}
        self.errors: list[str] = []
        self.strict = strict

    def matches(self, expression: str, device: Device) -> bool:
        try:
            prog = self._programs.get(expression)
            if prog is None:
                prog = self._programs[expression] = self._compile(expression)
            var = self._variable({"attributes": device.attributes, "capacity": device.capacity,
                                  "allowMultipleAllocations": device.multi}, device.driver)
            return prog.evaluate(var)
        except self._error as exc:
            self.errors.append(str(exc))
            if self.strict:
                raise SelectorError(str(exc)) from None
            return False


def default_selectors() -> CelSelectors:
    """The selectors the simulated cluster, capacity and conformance use unless given others."""
    return CelSelectors()

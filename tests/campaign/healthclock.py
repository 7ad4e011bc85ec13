"""The agent's health clock in the campaign (issue #40.4): a step moves it past the quiet period, no sleep."""


class HealthClock:
    """Seconds, monotonic: moved by the steps, kept across agent restarts (the world holds it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

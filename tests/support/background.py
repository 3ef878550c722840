"""A step a test runs beside the code under test (a fault to inject, a second run to start)."""

from __future__ import annotations

import threading


class BackgroundStep(threading.Thread):
    """Runs :meth:`step` in a daemon thread; what it raises is kept in ``error`` for the test to
    surface after the code under test returned."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.step()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def step(self) -> None:
        raise NotImplementedError

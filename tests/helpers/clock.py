"""A clock the test moves by hand (``clock.now += 5``), for code that takes a
``monotonic``/``clock`` callable."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

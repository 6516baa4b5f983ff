"""An ``on_error`` hook for RedisPool that remembers every report."""

from __future__ import annotations


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[BaseException, int, str]] = []

    def __call__(self, error: BaseException, *, attempt: int, action: str) -> None:
        self.calls.append((error, attempt, action))

    @property
    def actions(self) -> list[tuple[str, int]]:
        return [(action, attempt) for _, attempt, action in self.calls]

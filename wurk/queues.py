"""Queue lists and the order a fetch asks Redis for them.

Sidekiq semantics: queues given without weights are polled in strict order;
with weights, each queue appears ``weight`` times in a list that is shuffled
and de-duplicated on every fetch, so heavier queues come first more often
without starving lighter ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


class QueueSpecError(ValueError):
    """A ``name[:weight]`` entry is malformed."""


@dataclass(frozen=True)
class QueuePlan:
    names: tuple[str, ...]          # unique, in configured order
    weighted: tuple[str, ...]       # each name repeated weight times
    strict: bool

    def order(self, rng: random.Random | None = None) -> list[str]:
        """The queue names to poll this time, highest priority first."""
        if self.strict:
            return list(self.names)
        pool = list(self.weighted)
        (rng or random).shuffle(pool)
        return list(dict.fromkeys(pool))

    def weights(self) -> dict[str, int]:
        return {name: self.weighted.count(name) for name in self.names}


def parse_queue(spec: str) -> tuple[str, int | None]:
    """``"critical:3"`` or ``"critical,3"`` -> ("critical", 3); ``"low"`` -> ("low", None)."""
    text = spec.strip()
    name, weight_text = text, None
    for sep in (":", ","):
        if sep in text:
            name, weight_text = (part.strip() for part in text.rsplit(sep, 1))
            break
    if not name:
        raise QueueSpecError(f"has an empty queue name in {spec!r}")
    if weight_text is None:
        return name, None
    try:
        weight = int(weight_text)
    except ValueError:
        raise QueueSpecError(f"has a non-integer weight in {spec!r}") from None
    if weight < 0:
        raise QueueSpecError(f"has a negative weight in {spec!r}")
    return name, weight


def parse_queues(specs: list[str]) -> QueuePlan:
    parsed = [parse_queue(s) for s in specs]
    if not parsed:
        raise QueueSpecError("is empty")
    # As Sidekiq: strict unless some queue has a weight above 0.
    strict = all(not weight for _, weight in parsed)
    names = tuple(dict.fromkeys(name for name, _ in parsed))
    weighted: list[str] = []
    for name, weight in parsed:
        weighted.extend([name] * (1 if weight is None else max(weight, 0)))
    # A queue given weight 0 is still polled, just never ahead of the others.
    for name in names:
        if name not in weighted:
            weighted.append(name)
    return QueuePlan(names=names, weighted=tuple(weighted), strict=strict)

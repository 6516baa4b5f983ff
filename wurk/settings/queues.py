"""Queue lists and the order a fetch asks Redis for them.

Sidekiq semantics: queues given without weights are polled in strict order;
with weights, each fetch orders the queues as if each appeared ``weight``
times in a list that was shuffled and de-duplicated, so heavier queues come
first more often without starving lighter ones.

Duties:
1. Parse ``name[:weight]`` entries, refusing empty names and weights that
   are not integers from 0 to :data:`wurk.settings.bounds.MAX_QUEUE_WEIGHT`.
2. :meth:`QueuePlan.order`: that weighted order in time and memory that
   grow with the number of queues, never with their weights.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from wurk.settings.bounds import MAX_QUEUE_WEIGHT

_INTEGER = re.compile(r"-?[0-9]+")


class QueueSpecError(ValueError):
    """A ``name[:weight]`` entry is malformed."""


@dataclass(frozen=True)
class QueuePlan:
    names: tuple[str, ...]          # unique, in configured order
    weight_of: tuple[int, ...]      # each name's weight, at least 1, aligned with names
    strict: bool

    def order(self, rng: random.Random | None = None) -> list[str]:
        """The queue names to poll this time, highest priority first."""
        if self.strict:
            return list(self.names)
        # The first copy of a shuffled multiset is queue i with chance w_i / W,
        # and the rest follow the same rule among the queues left: weighted
        # sampling without replacement. An exponential clock of rate w_i per
        # queue, sorted, draws exactly that order without expanding anything.
        draw = rng or random
        clocks = [(draw.expovariate(weight), name)
                  for name, weight in zip(self.names, self.weight_of, strict=True)]
        return [name for _, name in sorted(clocks)]

    def weights(self) -> dict[str, int]:
        return dict(zip(self.names, self.weight_of, strict=True))


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
    if not _INTEGER.fullmatch(weight_text):
        raise QueueSpecError(f"has a non-integer weight in {spec!r}")
    weight = int(weight_text)
    if weight < 0:
        raise QueueSpecError(f"has a negative weight in {spec!r}")
    if weight > MAX_QUEUE_WEIGHT:
        raise QueueSpecError(f"has a weight above {MAX_QUEUE_WEIGHT} in {spec!r}")
    return name, weight


def parse_queues(specs: list[str]) -> QueuePlan:
    parsed = [parse_queue(s) for s in specs]
    if not parsed:
        raise QueueSpecError("is empty")
    # As Sidekiq: strict unless some queue has a weight above 0.
    strict = all(not weight for _, weight in parsed)
    totals: dict[str, int] = {}
    for name, weight in parsed:
        totals[name] = totals.get(name, 0) + (1 if weight is None else weight)
    # A queue given weight 0 is still polled, with the smallest weight there is.
    return QueuePlan(names=tuple(totals), weight_of=tuple(max(w, 1) for w in totals.values()),
                     strict=strict)

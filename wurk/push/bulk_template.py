"""A ``push_bulk`` with nothing to run per job, serialised once per push.

With no client middleware and no built-in step that has work (no
``unique_for``, no batch) and one run time for every job, the jobs of a bulk
push differ only in their args and jids. One job's payload is normalised as
any push normalises it, serialised once around those two fields, and each
job's text is its args and jid spliced in: the bytes serialising each payload
whole would give (floats in Ruby's forms included), at a fraction of the
cost. Every job's args are still checked, all of them before anything is
written.

Duties:
1. Say whether a bulk item can go this way (:func:`applies`).
2. Build the payload text around the two slots (:class:`Template`).
3. Yield each slice of :data:`~wurk.push.prepare.BULK_BATCH` jobs as the
   content of one push, with the slice's jids from one read of the OS's
   randomness (:func:`slices`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wurk.push import prepare, steps
from wurk.push.confirmed import ConfirmedPush, QueuedJob
from wurk.wire.payload import compact_json, new_jids, now_stamp, with_ruby_floats, writable

_SLOTS = ("args", "jid")


def applies(item: Mapping[str, Any], chain: Sequence[Any]) -> bool:
    """True when no job of ``item`` needs anything of its own but args and a jid."""
    return (not chain and not isinstance(item.get("at"), list)
            and all(isinstance(key, str) for key in item)
            and not any(built_in.field in item for built_in in steps.BUILT_IN))


@dataclass(frozen=True)
class Template:
    head: str  # the text before the args
    middle: str  # between the args and the jid
    tail: str  # after the jid
    queue: str
    run_at: float | None

    @classmethod
    def of(cls, prepared: prepare.Prepared) -> Template | None:
        """The template of a normalised payload; None unless its slots come args first."""
        payload, run_at = prepared
        if [key for key in payload if key in _SLOTS] != list(_SLOTS):
            return None
        segments: list[str] = []
        text = "{"
        for index, (key, value) in enumerate(payload.items()):
            text += ("," if index else "") + compact_json(key) + ":"
            if key in _SLOTS:
                segments.append(text)
                text = ""
            else:
                # Each value is a whole JSON token, so its Ruby float forms are
                # the ones it would get inside the whole text.
                text += with_ruby_floats(compact_json(value))
        head, middle, tail = [*segments, text + "}"]
        if not writable(head + middle + tail):  # the args were checked one by one
            prepare.refuse_unwritable(payload)
        return cls(head, middle + '"', '"' + tail, payload["queue"], run_at)

    def jobs(self, all_args: Sequence[list[Any]]) -> tuple[QueuedJob, ...]:
        head, middle, tail, queue, run_at = (self.head, self.middle, self.tail, self.queue,
                                             self.run_at)
        return tuple(
            QueuedJob(jid, queue,
                      f"{head}{with_ruby_floats(compact_json(args))}{middle}{jid}{tail}", run_at)
            for args, jid in zip(all_args, new_jids(len(all_args)), strict=True))


def slices(item: Mapping[str, Any], now: float, timestamps: str) -> Iterator[ConfirmedPush] | None:
    """Check ``item`` whole, then the pushes of its slices; None when its payload
    cannot be templated (push it job by job)."""
    all_args, at = prepare.check_bulk(item)
    if not all_args:
        return iter(())
    sample = prepare.bulk_item(prepare.bulk_shared(item), [], at, now_stamp(timestamps, now))
    template = Template.of(prepare.normalise(sample, now, timestamps, checked=True))
    if template is None:
        return None
    return (ConfirmedPush(template.jobs(all_args[start:start + prepare.BULK_BATCH]))
            for start in range(0, len(all_args), prepare.BULK_BATCH))

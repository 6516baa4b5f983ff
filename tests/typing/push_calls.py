"""Pushes a type checker must accept, and pushes it must flag (``# expect-error``).

Checked by tests/test_typed_push_typing.py with mypy and basedpyright: every
line marked ``# expect-error`` must get an error, and no other line may. Not
run: it is only read by the checkers.
"""

from __future__ import annotations

from datetime import UTC, datetime

import wurk


@wurk.job
def add(a: int, b: int) -> int:
    return a + b


@wurk.job(queue="mail", retry=3)
def welcome(user_id: int, *, address: str, greeting: str = "hi") -> None:
    pass


@wurk.job
async def fetch(url: str, timeout: float = 5.0) -> None:
    pass


class Charge(wurk.Job, queue="critical"):
    def perform(self, order_id: str, cents: int, *, note: str = "") -> None:
        pass


when = datetime(2030, 1, 1, tzinfo=UTC)

# -- function jobs: accepted ---------------------------------------------------
add.perform_async(1, 2)
add.perform_async(1, b=2)
add.perform_async(a=1, b=2)
add.perform_in(30, 1, 2)
add.perform_at(when, 1, b=2)
add.perform_at(2_000_000_000, 1, 2)
add.set(queue="low").perform_async(1, 2)
add.perform_bulk([add.args(1, 2), add.args(3, b=4), [5, 6]])
welcome.perform_async(42, address="ada@example.com")
welcome.perform_in(5, 42, address="ada@example.com", greeting="hello")
fetch.perform_async("https://example.com")
fetch.perform_async("https://example.com", timeout=2)
jid: str | None = add.perform_async(1, 2)
jids: list[str] = add.perform_bulk([add.args(1, 2)])

# -- function jobs: refused ------------------------------------------------------
add.perform_async("1", "2")  # expect-error
add.perform_async(1)  # expect-error
add.perform_async(1, 2, 3)  # expect-error
add.perform_async(1, c=2)  # expect-error
add.perform_in(30, "1", 2)  # expect-error
add.perform_in("soon", 1, 2)  # expect-error
add.perform_at(when, 1, "2")  # expect-error
add.set(queue="low").perform_async(1, "2")  # expect-error
add.perform_bulk([add.args(1, "2")])  # expect-error
add.perform_bulk([welcome.args(1, address="x")])  # expect-error
welcome.perform_async(42)  # expect-error
welcome.perform_async(42, "ada@example.com")  # expect-error
welcome.perform_async(42, address=7)  # expect-error
welcome.perform_async(42, address="a", colour="red")  # expect-error
fetch.perform_async(7)  # expect-error

# -- class jobs: accepted ----------------------------------------------------------
Charge.perform_async("order-1", 500)
Charge.perform_async("order-1", cents=500, note="gift")
Charge.perform_in(30, "order-1", 500)
Charge.perform_at(when, "order-1", 500)
Charge.set(retry=False).perform_async("order-1", 500)
Charge.perform_bulk([Charge.args("order-1", 500), ["order-2", 600]])

# -- class jobs: refused -------------------------------------------------------------
Charge.perform_async("order-1", "500")  # expect-error
Charge.perform_async("order-1")  # expect-error
Charge.perform_async("order-1", 500, tip=1)  # expect-error
Charge.perform_in(30, 1, 500)  # expect-error
Charge.perform_at(when, "order-1", 500, "note")  # expect-error
Charge.set(retry=False).perform_async(1, 500)  # expect-error
Charge.perform_bulk([Charge.args("order-1", "500")])  # expect-error
Charge.perform_bulk([add.args(1, 2)])  # expect-error


# -- the async verbs -------------------------------------------------------------------
async def from_async_code() -> None:
    await add.aperform_async(1, 2)
    await add.aperform_in(5, 1, b=2)
    await add.aperform_at(when, 1, 2)
    await add.aperform_bulk([add.args(1, 2)])
    await Charge.aperform_async("order-1", 500)
    await Charge.set(queue="x").aperform_async("order-1", 500)
    await Charge.aperform_bulk([Charge.args("order-1", 500)])
    await add.aperform_async(1, "2")  # expect-error
    await add.aperform_in(5, 1, c=2)  # expect-error
    await add.aperform_at(when, 1)  # expect-error
    await add.aperform_bulk([add.args("1", 2)])  # expect-error
    await Charge.aperform_async("order-1", 500, 1)  # expect-error
    await Charge.aperform_in(5, "order-1", cents="x")  # expect-error
    await Charge.aperform_at(when, cents=5)  # expect-error
    await Charge.aperform_bulk([Charge.args(cents=5)])  # expect-error

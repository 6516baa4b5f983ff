"""Testing code that pushes jobs, and the jobs, with wurk's pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import wurk
import wurk.testing
from examples.testing import shop


@pytest.fixture(autouse=True)
def _fresh_shop() -> Iterator[None]:
    yield
    shop.SENT.clear()
    shop.STOCK.clear()


def test_checkout_pushes_one_fulfilment(wurk_fake: wurk.testing.Fake) -> None:
    jid = shop.checkout(42, ["tea", "cups"])

    [job] = wurk_fake.jobs_of(shop.fulfil)
    assert job.jid == jid
    assert job.args == [42, ["tea", "cups"]]
    assert job.queue == "orders"
    assert shop.SENT == []  # nothing ran yet


def test_drain_runs_the_jobs_and_the_jobs_they_push(wurk_fake: wurk.testing.Fake) -> None:
    shop.checkout(42, ["tea", "cups"])

    wurk_fake.drain()

    assert shop.SENT == ["order42@example.com"]
    assert shop.STOCK == {"tea": 1, "cups": 1}
    assert wurk_fake.jobs == []


def test_a_flaky_job_is_retried_until_it_succeeds(wurk_fake: wurk.testing.Fake,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[str] = []

    def flaky(address: str, text: str) -> None:
        tries.append(address)
        if len(tries) < 3:
            raise shop.MailServerDownError("no answer")

    monkeypatch.setattr(shop, "deliver", flaky)
    shop.send_receipt.perform_async(7, "ada@example.com")

    assert wurk_fake.drain() == 3  # two failures, then the retry that succeeds
    assert wurk_fake.dead == []


def test_a_job_that_keeps_failing_ends_dead_and_drain_raises(
        wurk_fake: wurk.testing.Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(address: str, text: str) -> None:
        raise shop.MailServerDownError("no answer")

    monkeypatch.setattr(shop, "deliver", down)
    shop.send_receipt.perform_async(7, "ada@example.com")

    with pytest.raises(shop.MailServerDownError):
        wurk_fake.drain()  # the first run and its 3 retries all failed

    [dead] = wurk_fake.dead
    assert dead.args == [7, "ada@example.com"]
    assert dead.payload["error_class"] == "MailServerDownError"


def test_a_duplicate_unique_push_is_refused(wurk_fake: wurk.testing.Fake) -> None:
    assert shop.SyncStock.perform_async("tea") is not None
    assert shop.SyncStock.perform_async("tea") is None


def test_inline_runs_each_job_as_it_is_pushed(wurk_inline: wurk.testing.Inline) -> None:
    shop.checkout(7, ["tea"])

    assert shop.SENT == ["order7@example.com"]
    assert shop.STOCK == {"tea": 1}


@wurk.testing.inline()
def test_the_modes_are_decorators_too() -> None:
    shop.send_receipt.perform_async(1, "grace@example.com")
    assert shop.SENT == ["grace@example.com"]


def test_a_job_class_runs_without_any_worker() -> None:
    jid = shop.SyncStock().perform("tea")  # a jid and a payload are filled in

    assert len(jid) == 24
    assert shop.STOCK == {"tea": 1}

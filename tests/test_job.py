"""Jobs: the registry, ``@wurk.job``, ``wurk.Job`` classes and their options."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import wurk
from wurk.push.job import (
    DuplicateJobError,
    JobOptions,
    Registered,
    Registry,
    UnknownJobError,
    make_options,
)
from wurk.wire import keys


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    """Names registered in the global registry during a test, discarded after it."""
    names: list[str] = []
    yield names
    for name in names:
        wurk.registry.discard(name)


def double(x: int) -> int:
    return 2 * x


# -- @wurk.job ---------------------------------------------------------------


def test_job_registers_under_module_qualname() -> None:
    reg = Registry()
    fn = wurk.job(registry_=reg)(double)
    expected = f"{__name__}.double"
    assert fn.name == expected
    assert reg.names() == [expected]
    entry = reg.get(expected)
    assert entry.options == JobOptions()
    assert entry.origin == expected
    # The worker's factory hands back the plain function.
    assert entry.factory({"jid": "x"})(21) == 42


def test_bare_decorator_registers(cleanup: list[str]) -> None:
    def plain(x: int) -> int:
        return x + 1

    fn = wurk.job(plain)
    cleanup.append(f"{__name__}.{plain.__qualname__}")
    assert isinstance(fn, wurk.JobFunction)
    assert fn(1) == 2
    assert wurk.registry.get(cleanup[0]).name == fn.name


def test_job_registers_under_given_name_with_options() -> None:
    reg = Registry()

    @wurk.job(name="Mailer", queue="mail", retry=5, registry_=reg)
    def send(to: str) -> str:
        return f"sent to {to}"

    assert send.name == "Mailer"
    assert reg.names() == ["Mailer"]
    assert reg.get("Mailer").options.queue == "mail"
    assert reg.get("Mailer").options.retry == 5
    assert send.options.payload_fields() == {"queue": "mail", "retry": 5}


def test_calling_the_decorated_function_runs_it_inline(config: Any, r: redis.Redis) -> None:
    calls: list[tuple[Any, ...]] = []

    @wurk.job(name="Inline", registry_=Registry())
    def record(*args: Any, **kwargs: Any) -> str:
        """Docstring kept."""
        calls.append((args, kwargs))
        return "done"

    assert record(1, b=2) == "done"
    assert calls == [((1,), {"b": 2})]
    assert record.__doc__ == "Docstring kept."
    assert record.__wrapped__ is record.fn
    assert r.dbsize() == 0


def test_job_on_global_registry(cleanup: list[str]) -> None:
    @wurk.job(name="tests.global_one")
    def one() -> None:
        pass

    cleanup.append("tests.global_one")
    assert wurk.registry.find("tests.global_one") is not None
    assert "tests.global_one" in wurk.registry.names()
    wurk.registry.discard("tests.global_one")
    assert wurk.registry.find("tests.global_one") is None


def test_duplicate_name_from_another_definition_is_refused() -> None:
    reg = Registry()

    @wurk.job(name="Same", registry_=reg)
    def first() -> None:
        pass

    with pytest.raises(DuplicateJobError) as err:

        @wurk.job(name="Same", registry_=reg)
        def second() -> None:
            pass

    message = str(err.value)
    assert "'Same'" in message
    assert first.fn.__qualname__ in message
    assert "second" in message
    # The first registration is untouched.
    assert reg.get("Same").origin.endswith(first.fn.__qualname__)


def test_reregistering_the_same_definition_is_fine() -> None:
    reg = Registry()
    wurk.job(name="Twice", registry_=reg)(double)
    again = wurk.job(name="Twice", registry_=reg, queue="other")(double)
    assert reg.names() == ["Twice"]
    assert reg.get("Twice").options.queue == "other"
    assert again(4) == 8


def test_registry_get_unknown_name() -> None:
    reg = Registry()
    with pytest.raises(UnknownJobError) as err:
        reg.get("NoSuchJob")
    message = str(err.value)
    assert "'NoSuchJob'" in message
    assert "@wurk.job(name=...)" in message
    assert "require" in message
    assert isinstance(err.value, LookupError)
    assert reg.find("NoSuchJob") is None


def test_registry_discard_unknown_is_quiet() -> None:
    reg = Registry()
    reg.discard("never-registered")
    reg.add(Registered("X", JobOptions(), lambda _p: double, "m.X"))
    reg.discard("X")
    assert reg.names() == []


# -- wurk.Job classes ----------------------------------------------------------


def test_job_subclass_registers_with_class_options(cleanup: list[str]) -> None:
    class Charge(wurk.Job, queue="critical", retry=3):
        def perform(self, order: str) -> str:
            return f"{self.jid}:{order}"

    name = f"{__name__}.{Charge.__qualname__}"
    cleanup.append(name)
    assert Charge.wurk_name == name
    assert Charge.wurk_options.queue == "critical"
    assert Charge.wurk_options.retry == 3
    entry = wurk.registry.get(name)
    assert entry.options == Charge.wurk_options
    perform = entry.factory({"jid": "abc123", "args": ["o-1"]})
    assert perform("o-1") == "abc123:o-1"


def test_job_subclass_with_name(cleanup: list[str]) -> None:
    class Named(wurk.Job, name="tests.Named", backtrace=10):
        def perform(self) -> None:
            pass

    cleanup.append("tests.Named")
    assert Named.wurk_name == "tests.Named"
    assert wurk.registry.get("tests.Named").options.backtrace == 10


def test_job_subclass_inherits_options(cleanup: list[str]) -> None:
    class Base(wurk.Job, name="tests.Base", queue="mail", retry=7, tags=["t"]):
        pass

    class Child(Base, name="tests.Child", retry=2):
        def perform(self) -> None:
            pass

    class Grandchild(Child, name="tests.Grandchild"):
        pass

    cleanup.extend(["tests.Base", "tests.Child", "tests.Grandchild"])
    assert Child.wurk_options.queue == "mail"
    assert Child.wurk_options.retry == 2
    assert Child.wurk_options.tags == ("t",)
    assert Grandchild.wurk_options == Child.wurk_options
    assert Base.wurk_options.retry == 7
    assert wurk.registry.get("tests.Grandchild").options.retry == 2


def test_abstract_job_subclass_is_not_registered() -> None:
    before = set(wurk.registry.names())

    class Abstract(wurk.Job, abstract=True):
        pass

    assert set(wurk.registry.names()) == before
    assert "wurk_name" not in Abstract.__dict__


def test_job_without_perform_fails_when_run(cleanup: list[str]) -> None:
    class Empty(wurk.Job, name="tests.Empty"):
        pass

    cleanup.append("tests.Empty")
    with pytest.raises(NotImplementedError, match="Empty"):
        wurk.registry.get("tests.Empty").factory({})()


def test_job_class_retry_hooks(cleanup: list[str]) -> None:
    class Hooked(wurk.Job, name="tests.Hooked"):
        def perform(self) -> None:
            pass

        def retry_in(self, count: int, exc: BaseException) -> float:
            return count * 10.0 + len(str(exc))

        @classmethod
        def retries_exhausted(cls, payload: Any, exc: BaseException) -> None:
            pass

    cleanup.append("tests.Hooked")
    opts = Hooked.wurk_options
    assert opts.retry_in is not None
    assert opts.retry_in(3, ValueError("ab"), {}) == 32.0
    assert opts.retries_exhausted == Hooked.retries_exhausted
    # Hooks are server-side only: never in the payload.
    assert set(opts.payload_fields()) == {"queue", "retry"}


def test_duplicate_class_name_is_refused(cleanup: list[str]) -> None:
    class First(wurk.Job, name="tests.DupClass"):
        pass

    cleanup.append("tests.DupClass")
    with pytest.raises(DuplicateJobError):

        class Second(wurk.Job, name="tests.DupClass"):
            pass

    assert wurk.registry.get("tests.DupClass").origin.endswith("First")


def test_perform_async_on_a_job_class(config: Any, r: redis.Redis,
                                      cleanup: list[str]) -> None:
    class Charge(wurk.Job, name="ChargeCard", queue="critical", retry=5, dead=False,
                 tags=["billing"]):
        def perform(self, order: str, cents: int) -> None:
            pass

    cleanup.append("ChargeCard")
    jid = Charge.perform_async("o-1", 250)
    raws = r.lrange("queue:critical", 0, -1)
    assert len(raws) == 1
    job = json.loads(raws[0])
    assert job["jid"] == jid
    assert job["class"] == "ChargeCard"
    assert job["args"] == ["o-1", 250]
    assert job["queue"] == "critical"
    assert job["retry"] == 5
    assert job["dead"] is False
    assert job["tags"] == ["billing"]
    assert list(job)[:2] == ["retry", "queue"]
    assert list(job)[-3:] == ["jid", "created_at", "enqueued_at"]
    assert r.smembers(keys.QUEUES) == {"critical"}


def test_job_class_set_and_perform_in(config: Any, r: redis.Redis,
                                      cleanup: list[str]) -> None:
    class Later(wurk.Job, name="tests.Later", queue="low"):
        def perform(self, tag: str = "") -> None:
            pass

    cleanup.append("tests.Later")
    Later.set(queue="other", retry=False).perform_in(120)
    Later.perform_at(2_000_000_000.5, "x")
    by_args = {tuple(json.loads(m)["args"]): (json.loads(m), s)
               for m, s in r.zrange(keys.SCHEDULE, 0, -1, withscores=True)}
    job_in, _score_in = by_args[()]
    assert (job_in["queue"], job_in["retry"]) == ("other", False)
    job_at, score_at = by_args[("x",)]
    assert score_at == 2_000_000_000.5
    assert job_at["queue"] == "low"
    assert Later.wurk_options.queue == "low"


# -- make_options --------------------------------------------------------------


def test_make_options_defaults_and_changes() -> None:
    assert make_options() == JobOptions()
    opts = make_options(queue="mail", retry=0, tags=["a", "b"], retry_for=3600)
    assert opts.retry == 0
    assert opts.tags == ("a", "b")
    assert opts.payload_fields() == {"queue": "mail", "retry": 0, "tags": ["a", "b"],
                                     "retry_for": 3600}
    # A base is kept where a change does not touch it.
    assert make_options(opts, retry=False).queue == "mail"


@pytest.mark.parametrize("bad", [{"queu": "x"}, {"retries": 3}, {"wurk_name": "x"}])
def test_make_options_rejects_unknown_names(bad: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=repr(next(iter(bad)))):
        make_options(**bad)
    with pytest.raises(TypeError):
        wurk.job(registry_=Registry(), **bad)


@pytest.mark.parametrize("retry", [-1, "3", 2.5, None, [1]])
def test_make_options_rejects_bad_retry(retry: Any) -> None:
    with pytest.raises(TypeError, match="retry"):
        make_options(retry=retry)


@pytest.mark.parametrize("retry", [True, False, 0, 25])
def test_make_options_accepts_good_retry(retry: Any) -> None:
    assert make_options(retry=retry).retry == retry


@pytest.mark.parametrize("queue", ["", 5, None])
def test_make_options_rejects_bad_queue(queue: Any) -> None:
    with pytest.raises(TypeError, match="queue"):
        make_options(queue=queue)


@pytest.mark.parametrize("tags", ["abc", [1, 2], ["ok", None]])
def test_make_options_rejects_bad_tags(tags: Any) -> None:
    with pytest.raises(TypeError, match="tags"):
        make_options(tags=tags)


def test_bad_options_on_class_are_refused() -> None:
    before = set(wurk.registry.names())
    with pytest.raises(TypeError, match="retry"):

        class Bad(wurk.Job, name="tests.BadRetry", retry=-3):
            pass

    assert set(wurk.registry.names()) == before

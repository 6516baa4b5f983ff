"""A push kept for a Redis that never answered in this process warns, once
(``wurk.PushSpooledWarning``), naming the masked URL and the spool file it
will go to; made an error, it refuses the push; an outage of a Redis that
did answer stays quiet; a forked child warns on its own.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from pathlib import Path

import pytest
import redis.exceptions as rx
from conftest import RedisServer, free_port

import wurk
from wurk.push import nowhere
from wurk.push.client import Client
from wurk.push.spool import read_header, spool_dir
from wurk.redis.replay import Replay, RetrySettings
from wurk.settings.config import Config

JOB = {"class": "Echo", "args": [1]}


def dead_config(tmp_path: Path, password: str = "s3cret-pw") -> Config:
    """A Redis URL nothing listens on, with a password the warning must not show."""
    return Config(redis_url=f"redis://:{password}@127.0.0.1:{free_port()}/0",
                  redis_retry_attempts=1, redis_connect_timeout=0.2, push_flush_timeout=0.1,
                  spool_dir=str(tmp_path / "spool"), log_level="warning")


def test_the_first_push_to_a_redis_that_never_answered_warns_once(tmp_path: Path) -> None:
    config = dead_config(tmp_path)
    client = Client(config, drain_spool=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jid = client.push(JOB)  # the line the warning points at
        later = [client.push(JOB) for _ in range(3)]
    spooled = [w for w in caught if issubclass(w.category, wurk.PushSpooledWarning)]
    assert len(spooled) == 1, [str(w.message) for w in caught]
    warning = spooled[0]
    message = str(warning.message)
    assert warning.filename == __file__  # the application's line, not wurk's
    assert "s3cret-pw" not in message and "redis://:***@127.0.0.1:" in message
    assert f"job {jid}" in message and "has not answered" in message
    promised = Path(message.split("the spool file ")[1].split(" if Redis")[0])
    assert promised.parent == spool_dir(config) and not promised.exists()
    assert client.buffer is not None and len(client.buffer) == 4
    client.buffer.flush_at_exit()  # what the interpreter's exit does
    assert promised.exists()  # the file the warning named is the one written
    with promised.open("rb") as fh:
        assert read_header(fh).jobs == 4
    assert jid is not None and all(later)


def test_made_an_error_the_warning_refuses_the_push_and_keeps_nothing(
        tmp_path: Path) -> None:
    client = Client(dead_config(tmp_path), drain_spool=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", wurk.PushSpooledWarning)
        for _ in range(2):  # not said once and then silent: each push is refused
            with pytest.raises(wurk.PushSpooledWarning) as refused:
                client.push(JOB)
            assert isinstance(refused.value.__context__, Exception)  # the failed dial
    assert client.buffer is not None and len(client.buffer) == 0
    client.buffer.flush_at_exit()
    assert not list((tmp_path / "spool").glob("*.spool"))


def test_an_outage_of_a_redis_that_answered_keeps_quiet(own_redis: RedisServer,
                                                         tmp_path: Path) -> None:
    config = Config(redis_url=own_redis.url, redis_retry_attempts=1, redis_connect_timeout=0.2,
                    push_flush_timeout=0.1, spool_dir=str(tmp_path / "spool"),
                    log_level="warning")
    client = Client(config, drain_spool=False)
    assert client.push(JOB) is not None  # answered
    own_redis.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning at all fails the test
        assert client.push(JOB) is not None
    assert client.buffer is not None and len(client.buffer) == 1
    client.buffer.flush_at_exit()


def test_the_async_client_warns_the_same_way(tmp_path: Path) -> None:
    config = dead_config(tmp_path)

    async def main() -> list[warnings.WarningMessage]:
        async with wurk.AsyncClient(config, drain_spool=False) as client:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                await client.push(JOB)  # the line the warning points at
                await client.push(JOB)
        return caught

    caught = [w for w in asyncio.run(main())
              if issubclass(w.category, wurk.PushSpooledWarning)]
    assert len(caught) == 1 and caught[0].filename == __file__
    promised = Path(str(caught[0].message).split("the spool file ")[1].split(" if Redis")[0])
    assert promised.exists()  # aclose spooled what Redis never took, under that name


def test_a_forked_child_warns_of_its_own_first_push(tmp_path: Path) -> None:
    client = Client(dead_config(tmp_path), drain_spool=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.push(JOB)
    assert len(caught) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own process, its own first push
        os.close(read)
        with warnings.catch_warnings(record=True) as child_caught:
            warnings.simplefilter("always")
            client.push(JOB)
            client.push(JOB)
        os.write(write, str(len(child_caught)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        told = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert told == "1"
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        client.push(JOB)
    assert again == []  # the parent said it already
    assert nowhere._warned_in == os.getpid()
    assert client.buffer is not None
    client.buffer.flush_at_exit()


@pytest.mark.parametrize("reply", [
    rx.BusyLoadingError("Redis is loading the dataset in memory"),
    rx.ReadOnlyError("You can't write against a read only replica."),
    rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    rx.ResponseError("NOREPLICAS Not enough good replicas to write."),
])
def test_a_refusal_in_the_servers_own_words_counts_as_an_answer(reply: Exception) -> None:
    # A restarted server answers LOADING until its data is back: the URL is
    # right, and the pushes it refuses meanwhile must not warn of a wrong one.
    replay = Replay(RetrySettings(3, 0.01, 0.01))
    replay.judge(reply, 1, 3, idempotent=True, dirty=False)
    assert replay.answered


def test_a_dial_that_fails_is_no_answer() -> None:
    replay = Replay(RetrySettings(3, 0.01, 0.01))
    replay.judge(rx.ConnectionError("Error 111 connecting"), 1, 3, idempotent=True, dirty=False)
    assert not replay.answered

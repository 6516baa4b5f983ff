"""Job profiling (spec section 11): cProfile runs stored where Sidekiq 8 keeps profiles."""

from __future__ import annotations

import dataclasses
import gzip
import json
import marshal
import pstats
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import structlog
from conftest import RedisServer, free_port
from waiting import wait_for

import wurk
from wurk.api.profiles import ProfileNotFoundError, ProfileSet
from wurk.cli import main
from wurk.observe import profiler
from wurk.push.job import make_options, registry
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config


def profiled_work_marker(n: int) -> int:
    """The function every profile here must show."""
    return sum(i * i for i in range(n))


@pytest.fixture
def job_name(r: redis.Redis) -> Iterator[str]:
    name = f"prof_job_{uuid.uuid4().hex[:8]}"

    @wurk.job(name=name)
    def work(n: int, fail: bool = False) -> None:
        profiled_work_marker(n)
        r.rpush("prof:done", name)
        if fail:
            raise RuntimeError("profiled and failed")

    yield name
    registry.discard(name)


@pytest.fixture
def launcher(config: Config) -> Iterator[Launcher]:
    launcher = Launcher(config)
    launcher.start()
    yield launcher
    launcher.stop(time.monotonic() + 2)


def test_profiled_job_is_listed_fetched_and_opens_in_pstats(
        config: Config, r: redis.Redis, job_name: str, launcher: Launcher,
        tmp_path: Path) -> None:
    before = time.time()
    jid = wurk.Client(config).push({"class": job_name, "args": [20_000], "profile": "alice"})
    key = f"alice-{jid}"
    wait_for(lambda: r.zscore("profiles", key) is not None)

    names = ["token", "jid", "type", "started_at", "elapsed", "filename", "size"]
    fields = dict(zip(names, r.hmget(key, names), strict=True))
    assert fields["token"] == "alice" and fields["jid"] == jid
    assert fields["type"] == "cprofile"
    assert before - 1 <= int(fields["started_at"]) <= time.time()
    assert 0 < float(fields["elapsed"]) < 5
    assert fields["filename"].startswith(f"alice-{job_name}-{jid}-")
    assert fields["filename"].endswith(".prof")
    raw = redis.Redis(port=r.connection_pool.connection_kwargs["port"]).hget(key, "data")
    assert raw is not None and int(fields["size"]) == len(raw)
    assert isinstance(marshal.loads(gzip.decompress(raw)), dict)  # pstats' own format
    assert 86_000 < r.ttl(key) <= 86_400
    assert abs(float(r.zscore("profiles", key) or 0) - (time.time() + 86_400)) < 30

    records = ProfileSet(config=config).entries()
    assert [rec.key for rec in records] == [key]
    assert records[0].jid == jid and records[0].type == "cprofile"
    assert ProfileSet(config=config).fetch(key).size == len(raw)

    path = ProfileSet(config=config).save(key, tmp_path / "job.prof")
    functions = {name for _, _, name in pstats.Stats(str(path)).stats}  # type: ignore[attr-defined]
    assert "profiled_work_marker" in functions
    assert wait_for(lambda: r.lrange("prof:done", 0, -1)) == [job_name]


def test_failed_job_is_profiled_and_still_fails(
        config: Config, r: redis.Redis, job_name: str, launcher: Launcher) -> None:
    jid = wurk.Client(config).push({"class": job_name, "args": [10, True], "profile": "bob",
                                    "retry": 0})
    wait_for(lambda: r.zcard("dead") == 1)
    assert r.exists(f"bob-{jid}") == 1
    assert json.loads(r.zrange("dead", 0, 0)[0])["jid"] == jid


def test_unprofiled_job_writes_no_profile(
        config: Config, r: redis.Redis, job_name: str, launcher: Launcher) -> None:
    jids = [wurk.Client(config).push({"class": job_name, "args": [10]}),
            wurk.Client(config).push({"class": job_name, "args": [10], "profile": ""})]
    wait_for(lambda: r.llen("prof:done") == 2)
    # Both acknowledged, so past the point where a profile would be saved.
    wait_for(lambda: not [k for k in r.keys("wurk:wip:*") if r.type(k) == "list" and r.llen(k)],
             what="both jobs acknowledged")
    assert r.exists("profiles") == 0
    assert [k for k in r.keys("*") if any(k.endswith(f"-{jid}") for jid in jids)] == []


def test_profile_expires_from_the_list_after_its_ttl(config: Config, r: redis.Redis) -> None:
    short = dataclasses.replace(config, profile_ttl=1)
    job = {"class": "Short", "jid": "j1", "profile": "tok"}
    assert profiler.profiled(runtime_for(short), job, lambda: profiled_work_marker(100)) == 328_350
    profiles = ProfileSet(config=short)
    assert [rec.key for rec in profiles.entries()] == ["tok-j1"]
    assert len(profiles) == 1
    wait_for(lambda: not profiles.entries(), timeout=4.0, interval=0.1)
    assert r.zcard("profiles") == 0  # the reader pruned the index
    # The index's score and the key's TTL are set a moment apart: the key may
    # outlive its index entry by that moment, never by more.
    wait_for(lambda: not r.exists("tok-j1"), timeout=1.0, interval=0.01)
    with pytest.raises(ProfileNotFoundError):
        profiles.fetch("tok-j1")


def test_prune_removes_only_expired_keys(config: Config, r: redis.Redis) -> None:
    r.zadd("profiles", {"old-1": time.time() - 5, "new-1": time.time() + 100})
    r.hset("new-1", mapping={"token": "new", "type": "cprofile", "jid": "1"})
    assert ProfileSet(config=config).prune() == 1
    assert r.zrange("profiles", 0, -1) == ["new-1"]
    assert [rec.token for rec in ProfileSet(config=config).entries()] == ["new"]


def test_each_profile_written_prunes_the_expired_entries_with_no_reader(
        config: Config, r: redis.Redis) -> None:
    r.zadd("profiles", {f"old-{i}": time.time() - 5 for i in range(50)})
    job = {"class": "Pruner", "jid": "j2", "profile": "tok"}
    profiler.profiled(runtime_for(config), job, lambda: profiled_work_marker(10))
    assert r.zrange("profiles", 0, -1) == ["tok-j2"]


def test_profile_write_failure_leaves_the_job_result_alone(config: Config) -> None:
    dead = dataclasses.replace(config, redis_url=f"redis://127.0.0.1:{free_port()}/0",
                               redis_retry_attempts=1, redis_connect_timeout=0.2)
    try:
        calls: list[int] = []
        result = profiler.profiled(runtime_for(dead), {"class": "X", "jid": "j", "profile": "t"},
                                   lambda: calls.append(1) or "done")
        assert result == "done" and calls == [1]
    finally:
        close_runtime(dead)


def test_job_option_profile_puts_a_token_in_the_payload(config: Config, r: redis.Redis) -> None:
    name = f"prof_opt_{uuid.uuid4().hex[:8]}"

    @wurk.job(name=name, profile=True)
    def traced() -> None: ...

    try:
        traced.perform_async()
        traced.set(profile="carol").perform_async()
        traced.set(profile=False).perform_async()
        payloads = [json.loads(p) for p in reversed(r.lrange("queue:default", 0, -1))]
        assert [p.get("profile") for p in payloads] == [profiler.DEFAULT_TOKEN, "carol", None]
    finally:
        registry.discard(name)
    with pytest.raises(TypeError, match="profile"):
        make_options(profile=3)


def test_token_rules() -> None:
    assert profiler.token_of({"profile": "x"}) == "x"
    assert profiler.token_of({"profile": True}) == profiler.DEFAULT_TOKEN
    for value in (None, False, "", 7):
        assert profiler.token_of({"profile": value}) is None
    assert profiler.filename("t", "A::B/c", "j", 0.0) == "t-A__B_c-j-19700101-000000.prof"


Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(redis_server: RedisServer, r: redis.Redis,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    """``wurk --redis-url <test redis> profile ARGS...`` in process."""
    saved = structlog.get_config()  # the admin CLI sets logging to errors only

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(["--redis-url", redis_server.url, "profile", *argv])
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    structlog.configure(**saved)


def test_profile_command_lists_shows_and_saves(config: Config, r: redis.Redis, cli: Cli,
                                               tmp_path: Path) -> None:
    code, out, _ = cli("list")
    assert (code, out) == (0, 'no profiles (push a job with a "profile" token to record one)\n')
    profiler.profiled(runtime_for(config), {"class": "Cli", "jid": "j9", "profile": "dan"},
                      lambda: profiled_work_marker(1000))

    code, out, _ = cli("list")
    assert code == 0 and out.split("\n")[1].split()[:2] == ["dan-j9", "cprofile"]
    listed = json.loads(cli("list", "--json")[1])["profiles"]
    assert [(p["key"], p["jid"], p["type"]) for p in listed] == [("dan-j9", "j9", "cprofile")]

    shown = json.loads(cli("show", "dan-j9", "--json", "--limit", "100")[1])
    names = [f["function"] for f in shown["functions"]]
    assert any(name.endswith("(profiled_work_marker)") for name in names)
    cumulative = [f["cumtime"] for f in shown["functions"]]
    assert cumulative == sorted(cumulative, reverse=True)
    code, out, _ = cli("show", "dan-j9", "--sort", "calls")
    assert code == 0 and "CUMTIME" in out and "profiled_work_marker" in out

    code, out, _ = cli("save", "dan-j9", str(tmp_path), "--json")
    written = next(tmp_path.glob("dan-Cli-j9-*.prof"))
    assert code == 0 and json.loads(out)["path"] == str(written)
    assert any(name == "profiled_work_marker"
               for _, _, name in pstats.Stats(str(written)).stats)  # type: ignore[attr-defined]


def test_profile_command_failures(r: redis.Redis, cli: Cli) -> None:
    code, out, err = cli("show", "nope-1")
    assert (code, out) == (1, "") and "no profile 'nope-1'" in err
    assert cli("save", "nope-1")[0] == 2  # no PATH
    assert cli("list", "extra")[0] == 2
    r.zadd("profiles", {"ruby-j1": time.time() + 60})
    r.hset("ruby-j1", mapping={"token": "ruby", "type": "HardJob", "jid": "j1",
                               "data": gzip.compress(b"{}")})
    code, _, err = cli("show", "ruby-j1")
    assert code == 1 and "not cprofile" in err


# -- hostile values in Redis: nothing outside DIR, no marshal, one clear line ----------

def recorded(config: Config, r: redis.Redis, **fields: bytes | str) -> str:
    """A real profile's key, with ``fields`` then overwritten in Redis directly."""
    profiler.profiled(runtime_for(config), {"class": "Evil", "jid": "e1", "profile": "ev"},
                      lambda: profiled_work_marker(100))
    if fields:
        r.hset("ev-e1", mapping=fields)
    return "ev-e1"


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("filename", [
    "../../escaped.prof", "../escaped.prof", "/tmp/wurk-absolute-escape.prof", "sub/x.prof",
    "x\0y.prof", ".hidden.prof", "..", "a" * 5000 + ".prof", "ok\n.prof", "nul.txt", "",
])
def test_save_never_writes_outside_the_directory(config: Config, r: redis.Redis, cli: Cli,
                                                 tmp_path: Path, filename: str) -> None:
    key = recorded(config, r, filename=filename)
    target = tmp_path / "a" / "b" / "out"
    target.mkdir(parents=True)
    code, out, err = cli("save", key, str(target), "--json")
    assert (code, err) == (0, ""), err
    [written] = target.iterdir()
    assert tree(tmp_path) == {"a", "a/b", "a/b/out", f"a/b/out/{written.name}"}
    assert written.name == "ev-e1.prof" and json.loads(out)["path"] == str(written)
    assert not Path("/tmp/wurk-absolute-escape.prof").exists()
    assert any(name == "profiled_work_marker"
               for _, _, name in pstats.Stats(str(written)).stats)  # type: ignore[attr-defined]


def test_save_keeps_a_plain_stored_name_and_never_overwrites_or_follows(
        config: Config, r: redis.Redis, cli: Cli, tmp_path: Path) -> None:
    key = recorded(config, r, filename="ev-Evil-e1-20260101-000000.prof")
    assert cli("save", key, str(tmp_path))[0] == 0
    assert (tmp_path / "ev-Evil-e1-20260101-000000.prof").stat().st_size > 0
    code, _, err = cli("save", key, str(tmp_path))
    assert code == 1 and "already exists" in err and len(err.splitlines()) == 1
    outside = tmp_path.parent / f"{tmp_path.name}-victim"
    outside.write_text("keep me")
    folder = tmp_path / "links"
    folder.mkdir()
    (folder / "ev-Evil-e1-20260101-000000.prof").symlink_to(outside)
    code, _, err = cli("save", key, str(folder))
    assert code == 1 and len(err.splitlines()) == 1
    named = tmp_path / "named.prof"
    named.symlink_to(outside)
    code, _, err = cli("save", key, str(named))
    assert code == 1 and len(err.splitlines()) == 1
    assert outside.read_text() == "keep me"


def nested(depth: int) -> bytes:
    """Tuples in tuples, deeper than marshal itself would write."""
    return b")\x01" * depth + b")\x00"


SHAPE = {("f.py", 1, "f"): (1, 1, 0.5, 0.5, {})}
HOSTILE = {
    "not-gzip": b"this is not gzip",
    "truncated-gzip": gzip.compress(marshal.dumps(SHAPE))[:-9],
    "code-object": gzip.compress(marshal.dumps(compile("open('/tmp/pwned', 'w')", "x", "exec"))),
    "deep-nesting": gzip.compress(nested(100_000)),
    "not-a-dict": gzip.compress(marshal.dumps([1, 2, 3])),
    "wrong-row": gzip.compress(marshal.dumps({("f.py", 1, "f"): ("a", "b", "c", "d", {})})),
    "unhashable-key": gzip.compress(b"{)\x03[\x00\x00\x00\x00i\x01\x00\x00\x00i\x01\x00\x00\x000"),
    # A dict (flagged for back-references) whose key refers to the dict itself.
    "self-reference": gzip.compress(b"\xfb)\x03r" + bytes(4) + (b"i" + bytes(4)) * 2 + b"0"),
    "trailing-bytes": gzip.compress(marshal.dumps(SHAPE) + b"N"),
    "huge-count": gzip.compress(b"(\xff\xff\xff\x7f"),
    "set": gzip.compress(marshal.dumps({frozenset({1}): 1})),
}


@pytest.mark.parametrize("data", HOSTILE.values(), ids=list(HOSTILE))
def test_crafted_profile_data_is_refused_in_one_line(config: Config, r: redis.Redis, cli: Cli,
                                                     tmp_path: Path, data: bytes) -> None:
    key = recorded(config, r, data=data)
    for argv in (("show", key), ("save", key, str(tmp_path))):
        code, out, err = cli(*argv)
        assert (code, out) == (1, ""), err
        [line] = err.splitlines()
        assert line.startswith(f"wurk: cannot read profile '{key}': its data ")
    assert tree(tmp_path) == set()
    assert not Path("/tmp/pwned").exists()


def test_sizes_from_redis_are_bounded(config: Config, r: redis.Redis, cli: Cli,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("wurk.wire.profile_data.MAX_PROFILE_BYTES", 1 << 20)
    key = recorded(config, r, data=gzip.compress(b"\0" * (2 << 20)), size="-1")
    code, _, err = cli("show", key)
    assert code == 1 and "unzips to more than 1048576 bytes" in err
    monkeypatch.setattr("wurk.api.profiles.MAX_STORED_BYTES", 1000)
    r.hset(key, "data", b"x" * 2000)
    code, _, err = cli("show", key)
    assert code == 1 and "larger than 1000 bytes" in err


def test_show_never_hands_redis_data_to_marshal(config: Config, r: redis.Redis, cli: Cli,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("marshal was called on data from Redis")

    key = recorded(config, r)
    monkeypatch.setattr(marshal, "loads", refuse)
    monkeypatch.setattr(marshal, "load", refuse)
    code, out, err = cli("show", key, "--limit", "100")
    assert code == 0 and "profiled_work_marker" in out, err


def test_control_characters_from_redis_are_escaped(config: Config, r: redis.Redis,
                                                   cli: Cli) -> None:
    key = recorded(config, r, jid="j\x1b[2J")
    code, out, _ = cli("show", key)
    assert code == 0 and "\x1b" not in out and "job j\\x1b[2J ran" in out
    recorded(config, r, type="\x1b]0;owned\x07cprofile")
    code, out, _ = cli("list")
    assert code == 0 and "\x1b" not in out and "\\x1b]0;owned\\x07cprofile" in out

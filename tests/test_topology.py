"""supervisor.topology: parsing, defaults and every malformed-topology case."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from supervisor import cli
from supervisor.topology import MAX_CHILDREN, RANGES, Topology, TopologyError, load, parse

pytestmark = pytest.mark.timeout(60)

HERE = Path("topology.toml")
GOOD = textwrap.dedent("""
    [wurk]
    redis_url = "redis://127.0.0.1:6390/2"
    concurrency = 4
    queues = ["default"]
    require = ["myapp.jobs"]
    shutdown_timeout = 7
    max_memory_mb = 512
    respawn_backoff_max = 12.5
    boot_failure_limit = 2
    shutdown_grace = 1.5
    memory_check_interval = 0.5

    [[slot]]
    name = "web"
    count = 3
    queues = ["critical:3", "default:1"]

    [[slot]]
    name = "batch"
    concurrency = 2
    queues = ["batch"]
    max_memory_mb = 2048
    env = { BATCH = "1" }
    tag = "batchy"
    shutdown_timeout = 30
""")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def minimal(**extra: Any) -> dict[str, Any]:
    """A valid document to break one piece of at a time."""
    document: dict[str, Any] = {"wurk": {"redis_url": "redis://127.0.0.1:6390/0"},
                                "slot": [{"name": "a", "queues": ["default"]}]}
    document.update(extra)
    return document


def error_of(document: dict[str, Any]) -> str:
    with pytest.raises(TopologyError) as info:
        parse(document, HERE)
    message = str(info.value)
    assert message.startswith(str(HERE)), message  # every message names the file
    return message


# -- the good path -------------------------------------------------------------------

def test_load_builds_one_config_per_slot_with_shared_settings_and_overrides(
        tmp_path: Path) -> None:
    topology = load(write(tmp_path, GOOD))
    assert isinstance(topology, Topology)
    web, batch = topology.slots
    assert (web.name, web.count, web.config.concurrency) == ("web", 3, 4)
    assert web.config.queues == ["critical:3", "default:1"]
    assert web.config.require == ["myapp.jobs"]
    assert web.config.redis_url == "redis://127.0.0.1:6390/2"
    assert web.max_memory_mb == 512            # inherited from [wurk]
    assert web.env == {}
    assert (batch.count, batch.config.concurrency, batch.config.queues) == (1, 2, ["batch"])
    assert batch.max_memory_mb == 2048         # its own
    assert batch.env == {"BATCH": "1"}
    assert batch.config.tag == "batchy"
    assert batch.config.shutdown_timeout == 30
    assert topology.shutdown_timeout == 30     # the longest slot's
    assert (topology.respawn_backoff_max, topology.boot_failure_limit,
            topology.shutdown_grace, topology.memory_check_interval) == (12.5, 2, 1.5, 0.5)
    # Swarm-only keys never reach a worker Config.
    assert not hasattr(topology.base, "max_memory_mb")
    assert topology.base.concurrency == 4


def test_defaults_when_only_slots_are_given() -> None:
    topology = parse({"slot": [{"name": "only"}]}, HERE)
    (slot,) = topology.slots
    assert (slot.count, slot.max_memory_mb, slot.config.queues) == (1, 0, ["default"])
    assert (topology.boot_failure_limit, topology.shutdown_grace) == (3, 5.0)


def test_slot_max_memory_zero_overrides_the_shared_limit() -> None:
    document = minimal(wurk={"max_memory_mb": 100})
    document["slot"][0]["max_memory_mb"] = 0
    assert parse(document, HERE).slots[0].max_memory_mb == 0


@pytest.mark.parametrize(("document", "where", "needle"), [
    (minimal(wurk={"shutdown_timeout": 1e10}), "[wurk]", "shutdown_timeout must be from 0 to"),
    (minimal(wurk={"concurrency": 10_000_000}), "[wurk]", "concurrency must be from 1 to"),
    (minimal(slot=[{"name": "a", "concurrency": 10_000_000}]), "slot 'a'", "concurrency"),
    (minimal(slot=[{"name": "a", "queues": ["q:100000000000"]}]), "slot 'a'", "weight above"),
    (minimal(slot=[{"name": "a", "redis_url": "redis://:pw1234@h:99999/0"}]), "slot 'a'",
     "redis_url must have a port from 1 to 65535, got 'redis://:***@h:99999/0'"),
    (minimal(wurk={"redis_url": "redis://h:6379/abc"}), "[wurk]", "db that is a non-negative"),
], ids=["timeout", "concurrency", "slot-concurrency", "weight", "port", "db"])
def test_config_ranges_and_the_redis_url_apply_to_every_table(
        document: dict[str, Any], where: str, needle: str) -> None:
    message = error_of(document)
    assert where in message and needle in message and "pw1234" not in message


def test_check_exits_78_on_a_setting_out_of_range(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(textwrap.dedent("""\
        [wurk]
        shutdown_timeout = 1e10
        [[slot]]
        name = "a"
        """))
    assert cli.main(["--topology", str(toml), "--check"]) == 78
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"wurk-swarm: {toml}: [wurk]: shutdown_timeout must be from 0 to")


# -- malformed topologies: each names the key ----------------------------------------

@pytest.mark.parametrize(("document", "key"), [
    (minimal(workers=3), "'workers'"),
    (minimal(wurk={"concurency": 3}), "'concurency'"),
    (minimal(slot=[{"name": "a", "qeues": ["x"]}]), "'qeues'"),
], ids=["top-level", "wurk", "slot"])
def test_unknown_keys_are_named(document: dict[str, Any], key: str) -> None:
    message = error_of(document)
    assert "unknown key" in message
    assert key in message


@pytest.mark.parametrize(("document", "key", "value"), [
    (minimal(wurk={"concurrency": "ten"}), "concurrency", "'ten'"),
    (minimal(wurk={"shutdown_timeout": True}), "shutdown_timeout", "True"),
    (minimal(wurk={"max_memory_mb": 1.5}), "max_memory_mb", "1.5"),
    (minimal(wurk={"respawn_backoff_max": "30s"}), "respawn_backoff_max", "'30s'"),
    (minimal(wurk={"boot_failure_limit": True}), "boot_failure_limit", "True"),
    (minimal(wurk={"shutdown_grace": -1}), "shutdown_grace", "-1"),
    (minimal(wurk={"memory_check_interval": float("nan")}), "memory_check_interval", "nan"),
    (minimal(wurk=[1, 2]), "wurk", "[1, 2]"),
    (minimal(slot=[{"name": "a", "count": "2"}]), "count", "'2'"),
    (minimal(slot=[{"name": "a", "count": True}]), "count", "True"),
    (minimal(slot=[{"name": "a", "concurrency": 2.5}]), "concurrency", "2.5"),
    (minimal(slot=[{"name": "a", "max_memory_mb": "1G"}]), "max_memory_mb", "'1G'"),
    (minimal(slot=[{"name": "a", "env": {"A": 1}}]), "env", "{'A': 1}"),
    (minimal(slot=[{"name": "a", "queues": "default"}]), "queues", "'default'"),
    (minimal(slot=[{"name": "a", "queues": [1]}]), "queues", "[1]"),
    (minimal(slot=[{"name": "a", "require": "app"}]), "require", "'app'"),
    (minimal(slot=[{"name": 7}]), "name", "7"),
    (minimal(slot=["a"]), "slot", "'a'"),
    (minimal(slot={"name": "a"}), "slot", "{'name': 'a'}"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_wrong_types_name_the_key_and_value(document: dict[str, Any], key: str,
                                            value: str) -> None:
    message = error_of(document)
    assert key in message
    assert value in message


@pytest.mark.parametrize("count", [0, -2])
def test_count_below_one(count: int) -> None:
    message = error_of(minimal(slot=[{"name": "a", "count": count}]))
    assert "count" in message
    assert "from 1 to" in message
    assert repr(count) in message


def test_duplicate_slot_names() -> None:
    message = error_of(minimal(slot=[{"name": "a"}, {"name": "b"}, {"name": "a"}]))
    assert "slot.name 'a'" in message
    assert "more than one" in message


def test_boot_failure_limit_zero() -> None:
    message = error_of(minimal(wurk={"boot_failure_limit": 0}))
    assert "boot_failure_limit" in message


@pytest.mark.parametrize("document", [
    minimal(slot=[{"name": "a", "queues": []}]),
    minimal(wurk={"queues": []}, slot=[{"name": "a"}]),
    minimal(slot=[{"name": "a", "queues": [":3"]}]),
], ids=["slot-empty-list", "wurk-empty-list", "empty-name"])
def test_empty_queues(document: dict[str, Any]) -> None:
    message = error_of(document)
    assert "queues" in message


@pytest.mark.parametrize("slots", [None, []], ids=["missing", "empty"])
def test_missing_slot_tables(slots: list[Any] | None) -> None:
    document = minimal()
    if slots is None:
        del document["slot"]
    else:
        document["slot"] = slots
    assert "slot must be one or more [[slot]] tables" in error_of(document)


def test_blank_slot_name() -> None:
    assert "name must be a non-empty string" in error_of(minimal(slot=[{"name": "  "}]))


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(TopologyError, match="cannot read the topology file") as info:
        load(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(TopologyError, match="cannot read the topology file"):
        load(tmp_path)  # a directory
    if os.geteuid() != 0:  # root reads anything
        locked = write(tmp_path, GOOD)
        locked.chmod(0)
        with pytest.raises(TopologyError, match="cannot read the topology file"):
            load(locked)


@pytest.mark.parametrize("text", [
    "[wurk\nconcurrency = 1\n",
    "[[slot]]\nname = 'a'\nname = 'b'\n",
    "[[slot]]\nname = a\n",
])
def test_invalid_toml(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError, match="invalid TOML") as info:
        load(path)
    assert str(path) in str(info.value)


def test_not_utf8_is_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[[slot]]\nname = '\xe9'\n")
    with pytest.raises(TopologyError, match="invalid TOML"):
        load(path)


# -- through the real CLI ---------------------------------------------------------

def test_cli_check_reports_a_valid_topology(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--topology", str(write(tmp_path, GOOD)), "--check"]) == 0
    assert "4 children in 2 slots" in capsys.readouterr().out


MARK = "[wurk]\nrequire = ['mark_boot']\n"


@pytest.mark.parametrize(("text", "named"), [
    (MARK + "bogus = 1\n[[slot]]\nname = 'a'\n", "'bogus'"),
    (MARK + "[[slot]]\nname = 'a'\ncount = 0\n", "count"),
    (MARK + "concurrency = 2\n", "slot"),
    (MARK + "[[slot]]\nname = 'a'\n[[slot]]\nname = 'a'\n", "slot.name 'a'"),
    (MARK + "[[slot]]\nname = 'a'\nqueues = []\n", "queues"),
    ("not toml at all = = =\n", "invalid TOML"),
], ids=["unknown-key", "count", "no-slots", "duplicate", "empty-queues", "bad-toml"])
def test_cli_exits_78_naming_the_key_and_forks_nothing(tmp_path: Path, text: str,
                                                      named: str) -> None:
    path = write(tmp_path, text)
    # A require that would leave a mark if the swarm ever booted.
    marker = tmp_path / "booted"
    (tmp_path / "mark_boot.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "--topology", str(path)],
                          capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
                          check=False)
    assert proc.returncode == 78, proc.stderr
    assert named in proc.stderr
    assert str(path) in proc.stderr
    assert "child.spawned" not in proc.stderr
    assert not marker.exists()


def test_cli_unreadable_file_exits_78(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-t", str(tmp_path / "absent.toml")],
        capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 78
    assert "absent.toml" in proc.stderr
    assert "cannot read" in proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_cli_reads_only_a_regular_file_of_bounded_size(tmp_path: Path, kind: str) -> None:
    # A FIFO hung the read; /dev/zero ate 5 GB in 6 s. Each is one line and exit 78 now.
    path = tmp_path / "topology.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path.write_text("# padding\n" * 200_000)
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "-t", str(path)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 78, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert str(path) in line and "cannot read the topology file" in line
    assert {"fifo": "a FIFO", "device": "a character device", "huge": "allowed"}[kind] in line


# -- ranges: every number the parent reads is bounded ------------------------------

def one_line_error(document: dict[str, Any], *parts: str) -> str:
    message = error_of(document)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


@pytest.mark.parametrize(("document", "parts"), [
    (minimal(wurk={"shutdown_grace": float("inf")}), ("[wurk] shutdown_grace", "inf")),
    (minimal(wurk={"respawn_backoff_max": float("inf")}), ("[wurk] respawn_backoff_max",)),
    (minimal(wurk={"memory_check_interval": 1e9}), ("[wurk] memory_check_interval",)),
    (minimal(wurk={"max_memory_mb": 2**40}), ("[wurk] max_memory_mb", str(2**40))),
    (minimal(wurk={"boot_failure_limit": 10**6}), ("[wurk] boot_failure_limit",)),
    (minimal(wurk={"child_timeout": float("nan")}), ("[wurk] child_timeout", "nan")),
    (minimal(wurk={"child_timeout": 0}), ("[wurk] child_timeout", "got 0")),
    (minimal(wurk={"max_count": 10**6}), ("[wurk] max_count", "1000000")),
    (minimal(slot=[{"name": "a", "count": 1_000_000}]), ("slot 'a': count", "1000000")),
    (minimal(slot=[{"name": "a", "concurrency": 10_000_000}]),
     ("slot 'a': concurrency", "10000000")),
    (minimal(wurk={"concurrency": 10_000_000}), ("[wurk]", "concurrency", "10000000")),
    (minimal(slot=[{"name": "a", "shutdown_timeout": 1e10}]),
     ("slot 'a': shutdown_timeout", "10000000000.0")),
    (minimal(slot=[{"name": "a", "max_memory_mb": -1}]), ("slot 'a': max_memory_mb", "-1")),
    (minimal(slot=[{"name": "a", "child_timeout": float("inf")}]),
     ("slot 'a': child_timeout", "inf")),
    (minimal(slot=[{"name": "a", "count": 3, "max_count": 2}]),
     ("slot 'a': max_count", "count (3)", "got 2")),
    (minimal(wurk={"max_count": 2}, slot=[{"name": "a", "count": 3}]),
     ("slot 'a': max_count", "got 2")),
    (minimal(wurk={"heartbeat_interval": 5}, slot=[{"name": "a", "child_timeout": 6}]),
     ("slot 'a': child_timeout", "2 heartbeat_intervals", "got 6")),
], ids=["grace-inf", "backoff-inf", "memory-check-huge", "memory-huge", "boot-limit-huge",
        "child-timeout-nan", "child-timeout-zero", "max-count-huge", "count-huge",
        "slot-concurrency-huge", "wurk-concurrency-huge", "slot-shutdown-timeout-huge",
        "slot-memory-negative", "slot-child-timeout-inf", "max-count-below-count",
        "wurk-max-count-below-count", "child-timeout-below-two-beats"])
def test_numbers_outside_their_range_are_refused(document: dict[str, Any],
                                                 parts: tuple[str, ...]) -> None:
    message = one_line_error(document, *parts)
    assert "must be" in message and (" from " in message or "at least" in message)


@pytest.mark.parametrize(("env", "part"), [
    ({"A=B": "1"}, "'A=B'"),
    ({"": "1"}, "''"),
    ({"A\0B": "1"}, "'A\\x00B'"),
    ({"OK": "a\0b"}, "'a\\x00b'"),
], ids=["equals-in-key", "empty-key", "nul-in-key", "nul-in-value"])
def test_env_that_os_environ_cannot_take_is_refused(env: dict[str, str], part: str) -> None:
    one_line_error(minimal(slot=[{"name": "a", "env": env}]), "slot 'a': env", part)


def test_parent_only_slot_settings_default_inherit_and_override() -> None:
    document = minimal(wurk={"heartbeat_interval": 10},
                       slot=[{"name": "a", "count": 2},
                             {"name": "b", "count": 2, "child_timeout": 45, "max_count": 3},
                             {"name": "c", "count": 300}])
    a, b, c = parse(document, HERE).slots
    assert (a.child_timeout, a.max_count) == (60, 8)      # 6 heartbeats; 4 x count
    assert (b.child_timeout, b.max_count) == (45, 3)      # its own
    assert c.max_count == 1000                            # never above the ceiling
    assert parse(minimal(), HERE).slots[0].child_timeout == 30  # never under 30 s
    shared = parse(minimal(wurk={"child_timeout": 12, "max_count": 5}), HERE).slots[0]
    assert (shared.child_timeout, shared.max_count) == (12, 5)


@pytest.mark.parametrize(("text", "named"), [
    ("[wurk]\nshutdown_grace = inf\n[[slot]]\nname = 'a'\n", "[wurk] shutdown_grace"),
    ("[[slot]]\nname = 'a'\ncount = 1000000\n", "slot 'a': count"),
    ("[[slot]]\nname = 'a'\nconcurrency = 10000000\n", "slot 'a': concurrency"),
    ("[[slot]]\nname = 'a'\nenv = { 'A=B' = '1' }\n", "slot 'a': env key 'A=B'"),
    ("[[slot]]\nname = 'a'\nenv = { A = \"x\\u0000y\" }\n", "slot 'a': env A"),
], ids=["grace-inf", "count", "concurrency", "env-key", "env-value"])
def test_check_reports_a_range_error_in_one_line_with_exit_78(tmp_path: Path, text: str,
                                                              named: str) -> None:
    path = write(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "--topology", str(path),
                           "--check"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"wurk-swarm: {path}: ")
    assert named in proc.stderr


def num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def test_topology_reference_states_the_ranges_the_code_enforces() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs" / "reference"
    readme = (docs / "topology.md").read_text(encoding="utf-8")
    settings = (docs / "settings.md").read_text(encoding="utf-8")
    parent_keys = settings[settings.index("## The swarm parent's keys"):]
    rows = {line.split("|")[1].strip(" `"): line for line in parent_keys.splitlines()
            if line.startswith("| `")}
    for key in ("max_memory_mb", "respawn_backoff_max", "boot_failure_limit", "shutdown_grace",
                "memory_check_interval"):
        _, low, high = RANGES[key]
        assert f"| {num(low)} to {num(high)} |" in rows[key], (key, rows[key])
    assert f"to {num(RANGES['child_timeout'][2])} |" in rows["child_timeout"]
    assert f"to {num(RANGES['max_count'][2])} |" in rows["max_count"]
    prose = " ".join(readme.split())
    assert f"count` (children, default 1, at most {MAX_CHILDREN})" in prose
    for key in ("concurrency", "shutdown_timeout"):
        _, low, high = RANGES[key]
        assert f"`{key}` must be {num(low)} to {num(high)}" in prose or (
            f"`{key}` {num(low)} to {num(high)}" in prose), key


# -- the environment (issue #12: wurk-swarm reads WURK_* like every entry point) ----------

def test_wurk_variables_fill_what_the_file_leaves_out_and_the_file_wins() -> None:
    env = {"WURK_TAG": "from-env", "WURK_MAX_RETRIES": "7", "WURK_CONCURRENCY": "3",
           "REDIS_URL": "redis://env:1/0"}
    document = {"wurk": {"tag": "from-file"},
                "slot": [{"name": "a"}, {"name": "b", "concurrency": 9}]}
    topology = parse(document, HERE, env=env)
    assert topology.base.tag == "from-file"          # the file beats WURK_*
    assert topology.base.max_retries == 7            # WURK_* beats the default
    assert topology.base.redis_url == "redis://env:1/0"
    a, b = topology.slots
    assert (a.config.concurrency, b.config.concurrency) == (3, 9)  # a slot beats WURK_* too
    assert a.config.max_retries == 7 and a.config.tag == "from-file"
    both = {**env, "WURK_REDIS_URL": "redis://wurk:1/0"}
    assert parse(document, HERE, env=both).base.redis_url == "redis://wurk:1/0"
    filed = {"wurk": {"redis_url": "redis://file:1/0"}, "slot": [{"name": "a"}]}
    assert parse(filed, HERE, env=both).slots[0].config.redis_url == "redis://file:1/0"


@pytest.mark.parametrize(("env", "blamed"), [
    ({"WURK_MAX_RETRIES": "many"}, "WURK_MAX_RETRIES"),
    ({"WURK_CONCURRENCY": "0"}, "environment: WURK_CONCURRENCY"),
    ({"REDIS_URL": "bogus://x"}, "environment: REDIS_URL"),
])
def test_a_bad_environment_value_is_blamed_on_its_variable(env: dict[str, str],
                                                           blamed: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse({"slot": [{"name": "a"}]}, HERE, env=env)
    assert blamed in str(caught.value) and "\n" not in str(caught.value)


def test_wurk_swarm_check_reads_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[slot]]\nname = "a"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "--topology", str(path),
                           "--check"], env={**env, "WURK_CONCURRENCY": "0"},
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 78 and "WURK_CONCURRENCY" in done.stderr

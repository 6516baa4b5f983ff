"""Floats wurk writes survive a Ruby re-dump byte for byte.

Sidekiq's API finds a sorted-set member by dumping the job it parsed
(``SortedEntry#reschedule`` is a ZINCRBY of ``Sidekiq.dump_json(item)``), so
a float that Ruby prints differently from wurk makes it miss: the old entry
stays and a second one, due at once, appears. wurk's ``dumps`` writes floats
as Ruby 3.1's JSON does; these tests compare the two over every exponent,
subnormals, -0.0, integral floats and random bit patterns, and run Sidekiq's
real reschedule on a wurk-written entry.
"""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import redis
from conftest import RedisServer
from test_interop_support import run_ruby

from wurk.push.client import Client
from wurk.settings.config import Config
from wurk.wire.payload import dumps

AWKWARD = [1e300, -1e300, 1e15, 1e16, 1000000000000000.5, 6057321560302136.0, 5e-324,
           2.2250738585072014e-308, 1e-5, -0.0, 0.0, 2.0, 1.5e16]


def sample_floats() -> list[float]:
    rng = random.Random(20261130)
    found = [rng.random() * 10.0**e for e in range(-323, 308) for _ in range(2)]
    found += [5e-324 * rng.randint(1, 1 << 40) for _ in range(50)]
    found += [x for k in range(25) for x in (10.0**k, 10.0**-k, 1.5 * 10**k, float(10**k + 1))]
    for _ in range(1500):
        (value,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
        if value == value and abs(value) != float("inf"):
            found.append(value)
    return found + AWKWARD


def test_every_float_is_written_as_ruby_writes_it(redis_server: RedisServer,
                                                  tmp_path: Path) -> None:
    floats = sample_floats()
    listing = tmp_path / "floats.txt"
    listing.write_text("".join(f"{value!r}\n" for value in floats), encoding="utf-8")
    ruby = run_ruby(redis_server.url, "floats.rb", "generate", str(listing))
    ours = [dumps(value) for value in floats]
    wrong = [(f, o, r) for f, o, r in zip(floats, ours, ruby, strict=True) if o != r]
    assert not wrong, f"{len(wrong)} floats differ, e.g. (value, wurk, ruby): {wrong[:5]}"


def test_float_text_inside_strings_is_left_alone() -> None:
    payload = {"args": ["1e+16", "1234567890123456.0", 'q"1e+5', 1e16], "n": 1e-7}
    assert dumps(payload) == ('{"args":["1e+16","1234567890123456.0","q\\"1e+5",1.0e+16],'
                              '"n":1.0e-07}')


def test_sidekiq_reschedules_a_wurk_entry_with_awkward_floats(
        config: Config, redis_server: RedisServer, r: redis.Redis) -> None:
    jid = Client(config).push({"class": "RubyFloats", "queue": "ruby", "args": AWKWARD,
                               "at": time.time() + 60})
    entries = run_ruby(redis_server.url, "floats.rb", "reschedule", jid, "3600")
    # One entry, now due in an hour: Ruby's re-dump found wurk's bytes.
    assert [e["jid"] for e in entries] == [jid]
    assert entries[0]["score"] > time.time() + 3000

"""The names ``import wurk`` offers: every one listed in ``__all__`` is there,
and nothing of the flat layout that was never released."""

from __future__ import annotations

import importlib

import pytest

import wurk
from wurk.settings.config import Config


def test_the_public_names_did_not_move() -> None:
    # Names are added release by release; none that was public goes away.
    assert {
        "ArgumentError", "Client", "Config", "ConfigError", "Job", "JobFunction", "Leader",
        "PushBufferFullError", "PushNotConfirmedError", "UnknownJobError", "__version__",
        "configure", "default_config", "job", "leader", "registry"} <= set(wurk.__all__)
    assert all(hasattr(wurk, name) for name in wurk.__all__)
    # wurk.job is the decorator, not the module that defines it.
    assert callable(wurk.job) and wurk.job.__module__ == "wurk.push.job"


@pytest.mark.parametrize("old", ["wurk.config", "wurk.keys", "wurk.processor"])
def test_the_pre_layering_module_paths_do_not_import(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_a_config_holds_no_pool_shim() -> None:
    # Pools come from wurk.redis.runtime: runtime_for(config).pool and close_runtime(config).
    assert not hasattr(Config, "pool") and not hasattr(Config, "reset_pool")


def test_no_lookup_of_a_pool_by_config_is_left() -> None:
    # The runtime is handed to what needs it (wurk.redis.runtime); the
    # config-keyed lookup it replaced was never released.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("wurk.redis.pools")

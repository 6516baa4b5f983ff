"""Pre-layering import paths keep working for one release, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from wurk.old_paths import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_gives_the_moved_module_and_warns(old: str, new: str) -> None:
    # A fresh interpreter, so the old name is imported for the first time.
    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('error')\n"
        f"new = importlib.import_module({new!r})\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as warning:\n"
        "    print(warning)\n"
        "warnings.simplefilter('ignore')\n"
        f"print(importlib.import_module({old!r}) is new)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=True)
    warning, same = done.stdout.splitlines()
    assert warning.startswith(f"{old} moved to {new};")
    assert same == "True"


def test_from_wurk_import_an_old_module_name_resolves_to_the_moved_module() -> None:
    import wurk

    sys.modules.pop("wurk.keys", None)
    vars(wurk).pop("keys", None)
    with pytest.warns(DeprecationWarning, match=r"wurk\.keys moved to wurk\.wire\.keys"):
        from wurk import keys  # noqa: F401 - imported for the warning

    assert sys.modules["wurk.keys"] is importlib.import_module("wurk.wire.keys")


def test_the_public_names_did_not_move() -> None:
    import wurk

    assert sorted(wurk.__all__) == [
        "ArgumentError", "Client", "Config", "ConfigError", "Job", "JobFunction",
        "PushBufferFullError", "PushNotConfirmedError", "UniqueKeyError", "UnknownJobError",
        "__version__",
        "configure", "default_config", "job", "registry"]
    # wurk.job is the decorator, not the module that defines it.
    assert callable(wurk.job) and wurk.job.__module__ == "wurk.push.job"

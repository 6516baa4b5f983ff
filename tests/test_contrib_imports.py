"""The integrations stay optional: ``import wurk`` loads none of their packages,
and a missing package is an ImportError that names the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

OPTIONAL = ("opentelemetry", "sentry_sdk")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=30, check=False)


def test_import_wurk_loads_no_integration_package() -> None:
    # redis-py (8+) imports OpenTelemetry itself when it is installed, for its
    # own metrics: what counts is what wurk adds to what its dependencies load.
    done = run(f"""
        import sys
        import psutil, redis, setproctitle, structlog

        def loaded():
            return {{m for m in sys.modules if m.split(".")[0] in {OPTIONAL!r}}}

        before = loaded()
        import wurk, wurk.contrib, wurk.api, wurk.admin, wurk.runtime.launcher, supervisor.swarm
        print(sorted(loaded() - before), "sentry_sdk" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"


def test_only_wurk_contrib_imports_an_integration_package() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for path in [*(root / "wurk").rglob("*.py"), *(root / "supervisor").rglob("*.py")]:
        if "contrib" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path}: {n}" for n in names if n.split(".")[0] in OPTIONAL]
    assert found == []


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("wurk.contrib.opentelemetry", "opentelemetry", "wurk[opentelemetry]"),
    ("wurk.contrib.sentry", "sentry_sdk", "wurk[sentry]"),
])
def test_a_missing_package_names_its_extra(module: str, blocked: str, extra: str) -> None:
    # None in sys.modules makes the import fail as if the package were not installed.
    done = run(f"""
        import sys
        sys.modules[{blocked!r}] = None
        import {module}
    """)
    assert done.returncode != 0
    assert f"ImportError: {module} needs" in done.stderr
    assert f"pip install '{extra}'" in done.stderr

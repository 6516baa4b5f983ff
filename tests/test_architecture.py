"""The layers stay layers: lower packages never import higher ones.

The rules and the import graph live in scripts/structure.py (which also
prints the figures); docs/explanation/internals.md names the layers.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _structure() -> ModuleType:
    spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["structure"] = module
    spec.loader.exec_module(module)
    return module


structure = _structure()


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert structure.violations(structure.imports(ROOT)) == []


def test_every_wurk_module_belongs_to_a_layer() -> None:
    outside = [m for m in structure.modules(ROOT)
               if m.startswith("wurk") and structure.layer_of(m) is None]
    assert outside == []


def test_the_only_import_cycles_go_through_the_allowed_exceptions() -> None:
    edges = [e for e in structure.imports(ROOT)
             if (e.source, e.target) not in structure.ALLOWED_UPWARD]
    assert structure.cycles(edges) == []


def test_no_file_is_above_its_size_limit() -> None:
    assert structure.oversized(ROOT) == []


@pytest.mark.parametrize(("source", "target", "why"), [
    ("wurk.wire.keys", "wurk.runtime.processor", "wurk.wire is below wurk.runtime"),
    ("wurk.settings.config", "wurk.observe.metrics", "wurk.settings is below wurk.observe"),
    ("wurk.runtime.launcher", "supervisor.swarm", "wurk never imports supervisor"),
    ("supervisor.swarm", "wurk.admin.control", "supervisor uses only wurk's runtime and below"),
    ("supervisor.child_boot", "wurk.cli", "supervisor uses only wurk's runtime and below"),
    ("wurk.elsewhere", "wurk.core.logging", "a module outside every layer"),
    ("wurk.cli", "wurk.contrib.django.apps", "wurk.cli is below wurk.contrib"),
    ("wurk.runtime.hosting", "supervisor.hosting", "wurk never imports supervisor"),
    ("supervisor.cli", "wurk.contrib.django.boot", "supervisor uses only wurk's runtime and below"),
])
def test_the_checker_reports_each_kind_of_violation(source: str, target: str, why: str) -> None:
    [found] = structure.violations([structure.Edge(source, target, 1)])
    assert why in found


def test_the_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "wurk"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from wurk import b\n")
    (package / "b.py").write_text("def f():\n    from wurk.a import x\n")
    (tmp_path / "supervisor").mkdir()
    assert structure.cycles(structure.imports(tmp_path)) == [["wurk.a", "wurk.b"]]


def _loaded_by(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, cwd=ROOT)
    return done.stdout.split()


def test_the_swarm_parent_loads_neither_the_admin_cli_nor_the_api() -> None:
    loaded = _loaded_by("import supervisor.cli, supervisor.swarm, supervisor.child_boot, "
                        "supervisor.hosting")
    assert "supervisor.swarm" in loaded and "wurk.runtime.launcher" in loaded
    assert [m for m in loaded if m.startswith(("wurk.admin", "wurk.api", "wurk.cli"))] == []


def test_only_wurk_contrib_may_import_supervisor() -> None:
    edge = structure.Edge("wurk.contrib.asgi", "supervisor.hosting", 1)
    assert structure.violations([edge]) == []


def test_import_wurk_loads_no_worker_runtime_and_no_admin_side() -> None:
    loaded = _loaded_by("import wurk")
    assert "wurk.push.client" in loaded
    # The after-fork resets are the one runtime module every pushing process needs.
    assert [m for m in loaded if m.startswith("wurk.runtime.")] == ["wurk.runtime.forking"]
    assert [m for m in loaded if m.startswith(("wurk.admin", "wurk.api", "wurk.cli"))] == []
    # Framework integrations are optional extras: never imported by wurk itself.
    assert [m for m in loaded if m.startswith("wurk.contrib")
            or m.split(".")[0] in ("django", "flask", "starlette", "fastapi")] == []

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


def test_no_import_cycle_at_all_counting_lazy_and_type_only_imports() -> None:
    # Every edge counts, an allowed upward import included: it excuses the
    # layer rule, never a cycle.
    assert structure.cycles(structure.imports(ROOT)) == []


def test_the_job_skeleton_and_its_executors_import_no_feature() -> None:
    assert structure.feature_imports(structure.imports(ROOT)) == []


def test_the_checker_sees_a_feature_imported_by_the_skeleton() -> None:
    edges = [structure.Edge("wurk.runtime.processor", "wurk.batches.step", 3),
             structure.Edge("wurk.runtime.lifecycle.skeleton", "wurk.observe.metrics", 9),
             structure.Edge("wurk.runtime.steps", "wurk.batches.step", 1)]
    assert structure.feature_imports(edges) == [
        "wurk.runtime.processor:3 imports wurk.batches.step",
        "wurk.runtime.lifecycle.skeleton:9 imports wurk.observe.metrics"]


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


@pytest.mark.parametrize(("module", "plumbing"), [
    ("wurk.batches.keys", "wurk.wire.keys"),
    ("wurk.batches.lua", "wurk.wire.lua"),
    ("wurk.batches.push_lua", "wurk.wire.lua"),
    ("wurk.unique.push", "wurk.push.client"),
    ("wurk.batches.client", "wurk.push.client"),
    ("wurk.expiry.step", "wurk.runtime.manager"),
    ("wurk.unique.holders_api", "wurk.api.queue"),
    ("wurk.batches", "wurk.wire.keys"),  # the face: the lowest of its parts
])
def test_a_feature_module_takes_the_layer_of_its_part(module: str, plumbing: str) -> None:
    assert structure.layer_of(module) == structure.layer_of(plumbing)


@pytest.mark.parametrize("module", ["wurk.batches.helpers", "wurk.unique.inner.keys"])
def test_a_feature_module_whose_name_names_no_part_is_outside_every_layer(module: str) -> None:
    [found] = structure.violations([structure.Edge(module, "wurk.core.logging", 1)])
    assert "a module outside every layer" in found


@pytest.mark.parametrize(("source", "target", "why"), [
    ("wurk.batches.push", "wurk.batches.step", "wurk.push is below wurk.runtime"),
    ("wurk.batches.keys", "wurk.batches.client", "wurk.wire is below wurk.push"),
    ("wurk.push.steps", "wurk.unique.step", "wurk.push is below wurk.runtime"),
    ("wurk.runtime.reaper", "wurk.unique.api", "wurk.runtime is below wurk.api"),
    ("wurk.batches", "wurk.batches.push", "wurk.wire is below wurk.push"),
])
def test_a_feature_keeps_the_layer_order_inside_and_out(source: str, target: str,
                                                       why: str) -> None:
    [found] = structure.violations([structure.Edge(source, target, 1)])
    assert why in found


def test_plumbing_may_use_a_feature_part_at_or_below_its_layer() -> None:
    edges = [structure.Edge("wurk.push.steps", "wurk.batches.push", 1),
             structure.Edge("wurk.runtime.steps", "wurk.batches.step", 1),
             structure.Edge("wurk.batches.step", "wurk.batches.client", 1),
             structure.Edge("wurk.batches.api", "wurk.api.queue", 1)]
    assert structure.violations(edges) == []


def test_the_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "wurk"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from wurk import b\n")
    (package / "b.py").write_text("def f():\n    from wurk.a import x\n")
    (tmp_path / "supervisor").mkdir()
    assert structure.cycles(structure.imports(tmp_path)) == [["wurk.a", "wurk.b"]]


def test_the_checker_finds_a_cycle_through_a_type_only_import(tmp_path: Path) -> None:
    package = tmp_path / "wurk"
    (package / "inner").mkdir(parents=True)
    for init in (package / "__init__.py", package / "inner" / "__init__.py"):
        init.write_text("")
    (package / "inner" / "a.py").write_text("from . import b\n")
    (package / "inner" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    (tmp_path / "supervisor").mkdir()
    assert structure.cycles(structure.imports(tmp_path)) == [["wurk.inner.a", "wurk.inner.b"]]


def test_the_checker_finds_a_cycle_through_a_package_face(tmp_path: Path) -> None:
    # Importing wurk.api.common runs wurk/api/__init__.py first: a face that
    # hands on a feature's name is in a loop with the feature's module that
    # imports the face's package, though no module names the other back.
    package = tmp_path / "wurk"
    (package / "api").mkdir(parents=True)
    (package / "feature").mkdir()
    (package / "__init__.py").write_text("")
    (package / "api" / "__init__.py").write_text("from wurk.feature.api import Set\n")
    (package / "api" / "common.py").write_text("")
    (package / "feature" / "__init__.py").write_text("")
    (package / "feature" / "api.py").write_text("from wurk.api.common import text\n")
    (tmp_path / "supervisor").mkdir()
    assert structure.cycles(structure.imports(tmp_path)) == [["wurk.api", "wurk.feature.api"]]


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
    # A feature's client part loads (wurk.Batch), never its lifecycle step or its API.
    runtime = structure.layer_of("wurk.runtime")
    assert [m for m in loaded if m.startswith(structure.FEATURE_PACKAGES)
            and structure.layer_of(m) >= runtime] == []
    assert [m for m in loaded if m.startswith(("wurk.admin", "wurk.api", "wurk.cli"))] == []
    # Framework integrations are optional extras: never imported by wurk itself.
    assert [m for m in loaded if m.startswith("wurk.contrib")
            or m.split(".")[0] in ("django", "flask", "starlette", "fastapi")] == []

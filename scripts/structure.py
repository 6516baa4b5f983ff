"""Print the shape of the code: file sizes, layers, import cycles.

    .venv/bin/python scripts/structure.py [REPO_ROOT]

The import graph counts every import of a wurk or supervisor module: at the
top of a file, inside a function, and under ``if TYPE_CHECKING``. The
architecture test (tests/test_architecture.py) holds the same rules.

Two kinds of package share the layers:

- **Plumbing and the shells** (``wurk.wire``, ``wurk.push``, ``wurk.runtime``,
  ``wurk.api`` ...) each sit on one layer of LAYERS.
- **A feature package** (``wurk/<feature>/``, listed in FEATURE_PACKAGES)
  holds one feature's keys and scripts, client part, lifecycle step and API.
  Its modules spread over the layers: each takes the layer of its part's name
  in PARTS, the whole name or its last word after ``_`` (``keys``,
  ``push_lua`` and ``failure_lua`` are wire; ``push``, ``client``, ``spec``
  (what a client defines) and ``status`` (what a client reads back) push;
  ``step`` the runtime; ``api`` and ``holders_api`` would be the admin API). Its
  ``__init__`` is the package's face and takes the lowest layer (it states the
  feature's duties and imports nothing above its keys). So the layer order
  holds inside one feature too: its push part never imports its step, and the
  push pipeline may name a feature's push part but never its step or API.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# Bottom to top: a module may import its own layer and the ones below.
LAYERS: list[tuple[str, ...]] = [
    ("wurk.version", "wurk.core"),
    ("wurk.settings",),
    ("wurk.redis",),
    ("wurk.wire",),
    ("wurk.limiter",),  # checks through wurk.redis and wurk.wire; metrics and the runtime use it
    ("wurk.observe",),
    ("wurk.push",),
    ("wurk.runtime",),
    ("wurk.testing",),  # the testing mode: the push pipeline and the lifecycle, on memory
    ("wurk.api",),
    ("wurk.admin", "wurk.web"),  # siblings: the shell's tools and the browser's
    ("wurk.cli", "wurk"),  # "wurk" is the package's __init__ only, not all of it
    # Framework integrations: above everything, the swarm included (a Django
    # command runs one, an ASGI lifespan hosts one); nothing imports them.
    ("wurk.contrib",),
]
# Feature packages, each a slice through the layers (see the docstring).
FEATURE_PACKAGES = ("wurk.batches", "wurk.unique", "wurk.workflows", "wurk.expiry",
                    "wurk.results")
# A feature module's part, by name, and the plumbing layer it takes.
PARTS = {
    "keys": "wurk.wire", "lua": "wurk.wire", "records": "wurk.wire",
    "push": "wurk.push", "client": "wurk.push", "spec": "wurk.push", "status": "wurk.push",
    "step": "wurk.runtime",
    "api": "wurk.api",
}
# The one wurk layer that may import supervisor/: it sits above the swarm too.
USES_SUPERVISOR = "wurk.contrib"
# What supervisor/ may use of wurk: the runtime and everything below it.
SUPERVISOR_MAY_USE = next(i for i, layer in enumerate(LAYERS) if "wurk.runtime" in layer)
# Imports that break the order on purpose, each with its reason. None today;
# an entry here excuses the layer rule only: it still counts toward cycles.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
LIMITS = {"wurk": 400, "supervisor": 400, "tests": 600}
# The job lifecycle's skeleton and the executors that drive it name no
# feature: a feature joins as a step registered in wurk.runtime.steps.
SKELETON = ("wurk.runtime.lifecycle", "wurk.runtime.processor", "wurk.runtime.aio_processor")
FEATURES = (
    *FEATURE_PACKAGES, "wurk.runtime.steps",
    "wurk.runtime.time_limit_step", "wurk.runtime.job_timer", "wurk.runtime.cancelling",
    "wurk.runtime.task_limits", "wurk.runtime.observing", "wurk.runtime.overlimit",
    "wurk.observe", "wurk.limiter",
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in ("wurk", "supervisor"):
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def imports(root: Path) -> list[Edge]:
    """Every import of one of our modules, resolved to the module it names."""
    known = modules(root)
    edges = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                line = getattr(node, "lineno", 0)
                edges.extend(Edge(name, t, line) for t in _run_by(name, target, known))
    return edges


def _run_by(source: str, target: str, known: dict[str, Path]) -> list[str]:
    """What importing ``target`` from ``source`` runs: the module, and the
    ``__init__`` of each package above it that ``source`` is outside of
    (Python runs a package's face before its module). The roots are left
    out: every module runs ``wurk``'s and ``supervisor``'s."""
    parts = target.split(".")
    faces = [".".join(parts[:n]) for n in range(2, len(parts))]
    run = [face for face in faces if face in known and not _within(source, (face,))]
    return [m for m in [*run, target] if m != source]


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] in ("wurk", "supervisor")]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    if base.split(".")[0] not in ("wurk", "supervisor"):
        return []
    # "from wurk.wire import keys" names the module wurk.wire.keys.
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix that names this module or its package;
    in a feature package, the layer of the module's part."""
    feature = next((f for f in FEATURE_PACKAGES if _within(module, (f,))), None)
    if feature is not None:
        return _part_layer(module, feature)
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS)
               for prefix in prefixes
               if module == prefix or (prefix != "wurk" and module.startswith(prefix + "."))]
    return max(matches)[1] if matches else None


def _part_layer(module: str, feature: str) -> int | None:
    if module == feature:  # the package's face: the lowest of its parts
        return min(_plumbing_layer(prefix) for prefix in PARTS.values())
    name = module[len(feature) + 1:]
    if "." in name:  # a feature is one flat package: its parts name their layers
        return None
    prefix = PARTS.get(name) or PARTS.get(name.rpartition("_")[2])
    return None if prefix is None else _plumbing_layer(prefix)


def _plumbing_layer(prefix: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if prefix in layer)


def violations(edges: list[Edge]) -> list[str]:
    """Every import that breaks the layer rules, as readable lines."""
    found = []
    for edge in edges:
        source, target = edge.source, edge.target
        where = f"{source}:{edge.line} imports {target}"
        if source.startswith("wurk") and target.startswith("supervisor"):
            if not source.startswith(USES_SUPERVISOR + "."):
                found.append(f"{where}: wurk never imports supervisor")
        elif source.startswith("supervisor") and target.startswith("wurk"):
            level = layer_of(target)
            if level is None or level > SUPERVISOR_MAY_USE:
                found.append(f"{where}: supervisor uses only wurk's runtime and below")
        elif source.startswith("wurk"):
            low, high = layer_of(source), layer_of(target)
            if low is None or high is None:
                found.append(f"{where}: a module outside every layer (add it to LAYERS, "
                             "or name a feature's part as PARTS does)")
            elif high > low and (source, target) not in ALLOWED_UPWARD:
                found.append(f"{where}: {LAYERS[low][0]} is below {LAYERS[high][0]}")
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def feature_imports(edges: list[Edge]) -> list[str]:
    """Where the skeleton or an executor imports a feature."""
    return [f"{e.source}:{e.line} imports {e.target}" for e in edges
            if _within(e.source, SKELETON) and _within(e.target, FEATURES)]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop,
    largest first. The graph is small: reachability from every module will do."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    reach = {node: _reachable(graph, node) for node in graph}
    groups = {frozenset(other for other in reach[node] if node in reach[other]) | {node}
              for node in graph}
    return sorted((sorted(g) for g in groups if len(g) > 1), key=len, reverse=True)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def oversized(root: Path) -> list[tuple[str, int, int]]:
    """(path, lines, limit) of every file above its folder's limit."""
    found = []
    for folder, limit in LIMITS.items():
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > limit:
                found.append((str(path.relative_to(root)), lines, limit))
    return found


def report(root: Path) -> None:
    mods = modules(root)
    edges = imports(root)
    print(f"modules: {len(mods)} ({sum(1 for m in mods if m.startswith('wurk'))} in wurk, "
          f"{sum(1 for m in mods if m.startswith('supervisor'))} in supervisor)")
    for index, prefixes in enumerate(LAYERS):
        members = [m for m in mods if layer_of(m) == index]
        lines = sum(len(mods[m].read_text().splitlines()) for m in members)
        print(f"  layer {index}: {', '.join(prefixes):32} {len(members):3} modules {lines:6} lines")
    for feature in FEATURE_PACKAGES:
        parts = [f"{m.rpartition('.')[2]} ({LAYERS[layer_of(m) or 0][0]})"
                 for m in mods if m.startswith(feature + ".")]
        print(f"  feature {feature}: {', '.join(parts)}")
    big = oversized(root)
    print(f"files above the size limit: {len(big)}")
    for path, lines, limit in big:
        print(f"  {path}: {lines} lines (limit {limit})")
    groups = cycles(edges)
    caught = sum(len(g) for g in groups)
    print(f"import cycles: {len(groups)} ({caught} modules caught in one)")
    for group in groups:
        print(f"  {' <-> '.join(group)}")
    broken = violations(edges)
    print(f"layer violations: {len(broken)}")
    for line in broken:
        print(f"  {line}")


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)

"""Print the shape of the code: file sizes, layers, import cycles.

    .venv/bin/python scripts/structure.py [REPO_ROOT]

The import graph counts every import of a wurk or supervisor module: at the
top of a file, inside a function, and under ``if TYPE_CHECKING``. The
architecture test (tests/test_architecture.py) holds the same rules.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# Bottom to top: a module may import its own layer and the ones below.
LAYERS: list[tuple[str, ...]] = [
    ("wurk.version", "wurk.core", "wurk.old_paths"),
    ("wurk.settings",),
    ("wurk.redis",),
    ("wurk.wire",),
    ("wurk.limiter",),  # checks through wurk.redis and wurk.wire; metrics and the runtime use it
    ("wurk.observe",),
    ("wurk.push",),
    ("wurk.runtime",),
    ("wurk.api",),
    ("wurk.admin", "wurk.web"),  # siblings: the shell's tools and the browser's
    ("wurk.cli", "wurk"),  # "wurk" is the package's __init__ only, not all of it
    # Framework integrations: above everything, the swarm included (a Django
    # command runs one, an ASGI lifespan hosts one); nothing imports them.
    ("wurk.contrib",),
]
# The one wurk layer that may import supervisor/: it sits above the swarm too.
USES_SUPERVISOR = "wurk.contrib"
# What supervisor/ may use of wurk: the runtime and everything below it.
SUPERVISOR_MAY_USE = next(i for i, layer in enumerate(LAYERS) if "wurk.runtime" in layer)
# Imports that break the order on purpose, each with its reason.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("wurk.settings.config", "wurk.redis.pools"):
        "Config.pool and Config.reset_pool, deprecated shims kept for one release",
    ("wurk.settings.config", "wurk.redis.pool"):
        "the return type of the deprecated Config.pool shim (TYPE_CHECKING only)",
}
LIMITS = {"wurk": 400, "supervisor": 400, "tests": 600}


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
                if target != name:
                    edges.append(Edge(name, target, getattr(node, "lineno", 0)))
    return edges


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
    """The layer of the longest prefix that names this module or its package."""
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS)
               for prefix in prefixes
               if module == prefix or (prefix != "wurk" and module.startswith(prefix + "."))]
    return max(matches)[1] if matches else None


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
                found.append(f"{where}: a module outside every layer (add it to LAYERS)")
            elif high > low and (source, target) not in ALLOWED_UPWARD:
                found.append(f"{where}: {LAYERS[low][0]} is below {LAYERS[high][0]}")
    return found


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
    big = oversized(root)
    print(f"files above the size limit: {len(big)}")
    for path, lines, limit in big:
        print(f"  {path}: {lines} lines (limit {limit})")
    ruled = [e for e in edges if (e.source, e.target) not in ALLOWED_UPWARD]
    groups = cycles(ruled)
    caught = sum(len(g) for g in groups)
    print(f"import cycles: {len(groups)} ({caught} modules caught in one)")
    for group in groups:
        print(f"  {' <-> '.join(group)}")
    shimmed = [g for g in cycles(edges) if g not in groups]
    for group in shimmed:
        print(f"  through an allowed upward import only: {' <-> '.join(group)}")
    broken = violations(edges)
    print(f"layer violations: {len(broken)}")
    for line in broken:
        print(f"  {line}")


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)

"""No import circles inside the packages: every import between two of their modules points
one way, and inside the runtime down its layers (issue 37; docs/design.md §1). Read from
the source with `ast`; nothing is imported.

What counts as an edge A -> B: every `import` and `from ... import` in A, wherever it is —
at module level, inside `if TYPE_CHECKING:`, and inside functions. Lazy imports are how
the runtime stays light, not a licence to point back up: a module that imports its caller
inside a function still cannot be read, tested or replaced without it. An annotation is a
dependency a reader follows too. B is the module named (`from pkg import name` names
`pkg.name` when that is a module, else `pkg` itself); importing a module of another
package also counts an edge to that package's `__init__` (it runs first, and may import
more), but not to the `__init__`s A sits in (they are running already).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"ssd_runtime": "runtime", "ssd_graphs": "graphs", "ssd_export": "ssd_export",
            "ssd_distill": "ssd_distill"}


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module of the packages."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            is_init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}, inside the packages."""
    mods = modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in mods}
    for name, (path, is_init) in mods.items():
        here = name if is_init else name.rpartition(".")[0]         # the package it is in
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, here, mods):
                for module in _with_packages(target, name, mods):
                    graph[name].setdefault(module, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One closed path per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_packages_have_no_import_circles():
    graph = import_graph()
    found = cycles(graph)
    lines = []
    for path in found:
        lines.append(" -> ".join(path))
        lines += [f"    {a} imports {b} ({modules()[a][0].relative_to(ROOT)}:{graph[a][b]})"
                  for a, b in zip(path, path[1:])]
    assert not found, "import circles (move what both sides share to a module below " \
                      "them):\n" + "\n".join(lines)


# The runtime's layers, lowest first (docs/design.md §1): a module imports only modules of its
# own layer or below. A folder names its layer; a module at the top of runtime/ is listed.
RUNTIME_LAYERS = (
    ("contract", ("errors", "contract", "machine", "cache", "manifest", "engines")),
    ("backends", ("backends",)),
    ("round", ("round",)),
    ("scheduler", ("scheduler",)),
    ("generator and batch", ("request", "text", "batch", "generator")),
    ("CLI and server", ("", "cli", "bench", "bench_run", "serve")),  # "": ssd_runtime's __init__
)


def runtime_layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    for i, (_, parts) in enumerate(RUNTIME_LAYERS):
        if part in parts:
            return i
    raise AssertionError(f"{module} is in no layer of RUNTIME_LAYERS: add it to the layer it "
                         f"belongs to (docs/design.md §1)")


def test_runtime_imports_point_down_its_layers():
    graph = import_graph()
    up = [f"{a} ({RUNTIME_LAYERS[runtime_layer(a)][0]}) imports {b} "
          f"({RUNTIME_LAYERS[runtime_layer(b)][0]}), line {line}"
          for a, imported in graph.items() if a.startswith("ssd_runtime")
          for b, line in imported.items()
          if b.startswith("ssd_runtime") and runtime_layer(b) > runtime_layer(a)]
    assert not up, "imports that point up the runtime's layers (declare an interface at " \
                   "the lower layer, as drafting.Schedule does):\n" + "\n".join(up)


def test_the_graph_sees_imports_of_every_kind():
    """The reader itself: relative, absolute, lazy and TYPE_CHECKING imports are all edges."""
    graph = import_graph()
    assert "ssd_runtime.errors" in graph["ssd_runtime"]                    # from .errors import
    assert "ssd_runtime.generator" in graph["ssd_runtime"]                 # inside __getattr__
    assert "ssd_runtime.contract" in graph["ssd_graphs.trace"]             # absolute
    assert "ssd_runtime.backends" in graph["ssd_export.worth"]             # a package's __init__
    assert "ssd_runtime.backends.base" in graph["ssd_runtime.scheduler.batch_cost"]  # TYPE_CHECKING
    assert "ssd_runtime" not in graph["ssd_runtime.backends.ort"]          # its own package
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == \
        [["a", "b", "c", "a"]]


def _targets(node: ast.AST, here: str, mods: dict) -> list[str]:
    """The modules of the packages that one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")[:len(here.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in mods else module
                 for alias in node.names]
    else:
        return []
    found = []
    for name in names:
        while name and name not in mods:             # `import a.b.c` of a non-module c, etc.
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def _with_packages(target: str, importer: str, mods: dict) -> list[str]:
    """`target` and the package __init__s above it that `importer` is not inside of."""
    parts, mine = target.split("."), importer.split(".")
    found = []
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name == importer:
            continue
        if name == target or (name in mods and mine[:i] != parts[:i]):
            found.append(name)
    return found


def _path(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A closed path through the component, from its first module by name (breadth first)."""
    start = min(component)
    before = {start: ""}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while before[path[-1]]:
                    path.append(before[path[-1]])
                return [*reversed(path), start]
            if w in component and w not in before:
                before[w] = v
                queue.append(w)
    raise AssertionError("a strongly connected component has a cycle through each module")

"""The package's layering, read from its source with ``ast`` (nothing is imported).

Every import counts, at module level and inside functions (``if TYPE_CHECKING:`` blocks never run and do not): data
moves one way (docs/architecture.md). A module that needs one above it imports it inside the function that needs it,
at call time; each such deferred import that reaches up (its target imports the importing module, directly or
through others) is a seam, named in docs/architecture.md, "Seams" (at most four). Without the seams' imports the graph
has no cycle, and every import goes down the map's order of rooms (``ROOMS``). The rooms keep their places: the core
never imports the tracer, the tracer neither draws nor runs the crossover benchmark, backends import only backends,
and nothing imports the package root. No module runs past 600 lines, and none reaches into another module's private
names.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "gpuworkbench"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    """One intra-package import: ``module`` imports ``target`` at ``path:line``, inside ``function`` ("" at module
    level). ``runs`` is what importing ``target`` from ``module`` executes: ``target`` and the packages above it that
    are not above ``module`` (their ``__init__`` runs first)."""

    module: str
    target: str
    path: str
    line: int
    function: str
    runs: tuple[str, ...]


def find_modules(package_dir: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``package_dir`` (a package's name maps to its __init__)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules an import statement names: ``from X import a, b`` names ``X.a`` where it is a module, else ``X``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    names = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        names.append(sub if sub in known else source)
    return list(dict.fromkeys(names))


class _ImportReader:
    """Collects one module's intra-package imports (see ``read_imports``)."""

    def __init__(self, module: str, path: str, is_package: bool, known: set[str], package: str) -> None:
        self.module, self.path, self.is_package, self.known, self.package = module, path, is_package, known, package
        self.above = set(_ancestors(module))
        self.found: list[Import] = []

    def visit(self, node: ast.AST, function: str = "", scope: str = "") -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the `if TYPE_CHECKING:` body never runs
                self.visit(child, function, scope)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.add(node, function)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{scope}.{node.name}" if scope else node.name
            inner = function if isinstance(node, ast.ClassDef) else name  # a class body runs where the class is made
            for child in node.body:
                self.visit(child, inner, name)
        elif not isinstance(node, ast.Lambda):
            for child in ast.iter_child_nodes(node):
                self.visit(child, function, scope)

    def add(self, node: ast.Import | ast.ImportFrom, function: str) -> None:
        for target in _targets(node, self.module, self.is_package, self.known):
            if target == self.module or not (target == self.package or target.startswith(self.package + ".")):
                continue
            runs = (target, *(p for p in _ancestors(target) if p not in self.above and p != self.module))
            self.found.append(Import(self.module, target, self.path, node.lineno, function, runs))


def read_imports(modules: dict[str, Path], root: Path, package: str) -> list[Import]:
    """Every import of a module of ``package`` by one of its modules, at module level or inside a function. Imports
    under ``if TYPE_CHECKING:`` never run and are left out; module level includes module-level ``if`` / ``try`` /
    ``with`` blocks and class bodies."""
    found: list[Import] = []
    for module, path in modules.items():
        reader = _ImportReader(
            module, path.relative_to(root).as_posix(), path.name == "__init__.py", set(modules), package
        )
        reader.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found.extend(reader.found)
    return found


def module_graph(imports: list[Import]) -> dict[str, set[str]]:
    """Module → the modules its module-level imports run."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.function:
            graph.setdefault(imp.module, set()).update(imp.runs)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts (``[a, b, a]``), or None. Deterministic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = walk(start)
            if cycle:
                return cycle
    return None


def import_chain(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of module-level imports from ``start`` to ``goal`` (both included), or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            chain = [node]
            while previous[chain[-1]] is not None:
                chain.append(previous[chain[-1]])  # type: ignore[arg-type]
            return chain[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


@dataclass(frozen=True)
class Seam:
    """A deferred import that reaches up: ``imp`` imports a module whose module-level imports lead back (``chain``)."""

    imp: Import
    chain: tuple[str, ...]

    def key(self, package: str) -> tuple[str, str, str]:
        """How the Seams table names it: the file and the module relative to the package (``trace/recorder.py``,
        ``viz.timeline``; the package itself by its name), and the function's dotted name (``Trace.show``)."""
        return (
            self.imp.path.removeprefix(f"{package}/"),
            self.imp.function,
            self.imp.target.removeprefix(f"{package}."),
        )


def find_seams(imports: list[Import]) -> list[Seam]:
    """Imports inside functions whose target (or a package it runs) leads back to the importing module."""
    graph = module_graph(imports)
    seams = []
    for imp in imports:
        if not imp.function:
            continue
        for ran in imp.runs:
            chain = import_chain(graph, ran, imp.module)
            if chain:
                seams.append(Seam(imp, tuple(chain if ran == imp.target else [imp.target, *chain])))
                break
    return seams


def seams_section(markdown: str) -> str:
    """The text of the "## Seams" section, up to the next "## " heading."""
    match = re.search(r"^## Seams\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    assert match, f"{ARCHITECTURE.relative_to(ROOT)} has no '## Seams' section"
    return match.group(1)


def named_seams(markdown: str) -> set[tuple[str, str, str]]:
    """The rows of the table in the "## Seams" section: | `file` | `function` | `module`, `module` | why |."""
    rows = set()
    for line in seams_section(markdown).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 3 or set(cells[0]) <= set("-: "):
            continue
        path, function = cells[0].strip("`"), cells[1].strip("`")
        if path == "file":  # the header
            continue
        for target in re.findall(r"`([^`]+)`", cells[2]):
            rows.add((path, function, target))
    return rows


def _module_fetched(value: ast.expr) -> str | None:
    """X where ``value`` is ``sys.modules.get("X")``, ``sys.modules["X"]`` or ``importlib.import_module("X")``."""
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Constant):
        name = ast.unparse(value.func)
        if name in ("sys.modules.get", "importlib.import_module", "import_module"):
            return str(value.args[0].value)
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "sys.modules":
        key = value.slice
        return str(key.value) if isinstance(key, ast.Constant) else None
    return None


def find_patches(modules: dict[str, Path], root: Path, package: str) -> list[tuple[str, int, str, str]]:
    """Where a function replaces an attribute of another library's module, fetched by name (``m =
    sys.modules.get("torch.autograd.profiler")`` then ``m._prepare_profiler = ...`` or ``setattr(m, "...", ...)``):
    (path, line, function, "module.attribute")."""
    found = []
    for path in modules.values():
        rel = path.relative_to(root).as_posix()
        for func in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            fetched: dict[str, str] = {}
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    source = _module_fetched(node.value)
                    if source and source.split(".")[0] != package:
                        fetched[node.targets[0].id] = source
            for node in ast.walk(func):
                patched = None
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                            patched = (target.value.id, target.attr)
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "setattr"
                    and len(node.args) == 3
                    and isinstance(node.args[0], ast.Name)
                    and isinstance(node.args[1], ast.Constant)
                ):
                    patched = (node.args[0].id, str(node.args[1].value))
                if patched and patched[0] in fetched:
                    found.append((rel, node.lineno, func.name, f"{fetched[patched[0]]}.{patched[1]}"))
    return found


def seam_problems(seams: list[Seam], named: set[tuple[str, str, str]], package: str) -> list[str]:
    """One line per seam the table lacks (with its file:line and the row to add) and per row the code lacks."""
    problems = [
        f"  {s.imp.path}:{s.imp.line} {s.imp.function} imports {s.imp.target}, which leads back"
        f" ({' → '.join(s.chain)}): name it, a row | `{k[0]}` | `{k[1]}` | `{k[2]}` | why |"
        for s in seams
        if (k := s.key(package)) not in named
    ]
    found = {s.key(package) for s in seams}
    problems += [f"  a row names a seam the code no longer has: {row}" for row in sorted(named - found)]
    return problems


# ---------------------------------------------------------------------------------------------- the package itself
MODULES = find_modules(ROOT / PACKAGE, PACKAGE)
IMPORTS = read_imports(MODULES, ROOT, PACKAGE)


def test_every_module_is_read() -> None:
    assert {"gpuworkbench", "gpuworkbench.device", "gpuworkbench.trace.recorder", "gpuworkbench.viz"} <= set(MODULES)
    graph = module_graph(IMPORTS)
    assert "gpuworkbench.buffer" in graph["gpuworkbench"]  # `from .buffer import Buffer`
    assert "gpuworkbench.ops" in graph["gpuworkbench"]  # `from . import ops`: a submodule, not the package
    assert "gpuworkbench.trace" in graph["gpuworkbench.viz.timeline"]  # trace/__init__ runs before trace.analysis


def test_module_level_imports_have_no_cycle() -> None:
    cycle = find_cycle(module_graph(IMPORTS))
    assert cycle is None, "module-level imports form a cycle: " + " → ".join(cycle or [])


def test_every_seam_is_named_in_architecture_md() -> None:
    problems = seam_problems(find_seams(IMPORTS), named_seams(ARCHITECTURE.read_text(encoding="utf-8")), PACKAGE)
    assert not problems, f"{ARCHITECTURE.relative_to(ROOT)} § Seams and the code disagree:\n" + "\n".join(problems)


def test_every_patch_of_another_library_is_named_in_architecture_md() -> None:
    patches = find_patches(MODULES, ROOT, PACKAGE)
    assert any(p[2] == "hook_torch_profiler" for p in patches), patches  # the one there is
    section = seams_section(ARCHITECTURE.read_text(encoding="utf-8"))
    unnamed = [p for p in patches if f"`{p[2]}`" not in section or f"`{p[3]}`" not in section]
    assert not unnamed, "functions that replace another library's attribute, not named in {} § Seams:\n{}".format(
        ARCHITECTURE.relative_to(ROOT),
        "\n".join(f"  {path}:{line} {function} replaces {what}" for path, line, function, what in unnamed),
    )


def full_graph(imports: list[Import], skip: set[tuple[str, str, str]] = frozenset(), package: str = PACKAGE):
    """Module → the modules any of its imports runs, at module level or inside a function, leaving out the imports
    whose (file, function, target) is in ``skip`` (the named seams)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        key = (imp.path.removeprefix(f"{package}/"), imp.function, imp.target.removeprefix(f"{package}."))
        if key not in skip:
            graph.setdefault(imp.module, set()).update(imp.runs)
    return graph


def _in(module: str, *rooms: str) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


#: The core: what every op passes through. It announces to ``listeners`` and never imports the tracer.
CORE = ("device", "buffer", "streams", "_dispatch", "_memory", "ranges", "listeners", "op_names", "persistent")
BACKENDS_MAY_IMPORT = ("backends", "errors", "_format")
MAX_SEAMS = 4
MAX_LINES = 600


def rule_breaks(imports: list[Import], named: set[tuple[str, str, str]], package: str = PACKAGE) -> list[str]:
    """One line per import that breaks a room's rule (see the module's docstring); named seams may reach up."""
    breaks = []
    core = tuple(f"{package}.{name}" for name in CORE)
    backends_may = tuple(f"{package}.{name}" for name in BACKENDS_MAY_IMPORT)
    for imp in imports:
        key = (imp.path.removeprefix(f"{package}/"), imp.function, imp.target.removeprefix(f"{package}."))
        where = f"  {imp.path}:{imp.line} imports {imp.target}"
        if imp.target == package and imp.module != package:
            breaks.append(f"{where}: the package root (import the module itself)")
        if _in(imp.module, *core) and _in(imp.target, f"{package}.trace"):
            breaks.append(f"{where}: the core never imports the tracer (announce through listeners)")
        if _in(imp.module, f"{package}.trace") and key not in named:
            if _in(imp.target, f"{package}.viz", f"{package}.notebook", f"{package}.library"):
                breaks.append(f"{where}: the tracer neither draws, nor runs benchmarks, nor knows the notebook")
        if _in(imp.module, f"{package}.backends") and not _in(imp.target, *backends_may):
            breaks.append(f"{where}: a backend imports only backends, errors and _format")
        if _in(imp.module, f"{package}.viz") and _in(imp.target, f"{package}.backends"):
            breaks.append(f"{where}: the pictures know no backend")
    return breaks


def long_modules(modules: dict[str, Path], limit: int = MAX_LINES) -> list[str]:
    """Modules over ``limit`` lines, unless their first line is a comment that says why (a table, generated text)."""
    found = []
    for path in modules.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > limit and not lines[0].startswith("#"):
            found.append(f"  {path.as_posix()}: {len(lines)} lines")
    return found


def _defined_private(tree: ast.AST) -> set[str]:
    """Underscore names a module defines or names itself: functions, classes, attributes it stores, arguments,
    strings (``__slots__``, ``getattr``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return {n for n in names if n.startswith("_")}


def _other_libraries(tree: ast.AST, package: str) -> set[str]:
    """Names bound to another library's module (``import torch``, ``m = sys.modules.get("torch")``): what code
    reads of them is that library's business (a seam with it), not another module of ours."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith(package))
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith(package):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            fetched = _module_fetched(node.value)
            if fetched and not fetched.startswith(package):
                names.add(node.targets[0].id)
    return names


def _root_name(node: ast.expr) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def private_reaches(modules: dict[str, Path], package: str = PACKAGE) -> list[str]:
    """``from .x import _name`` of a name (not a module) across modules, and ``obj._attr`` where no code of the same
    module makes ``_attr``: another module's private name. Dunders and other libraries' ``name_`` spellings pass, and
    so does a line that says whose attribute it reads (``# other library: ...``), a seam with that library."""
    found = []
    for module, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        own = _defined_private(tree)
        theirs = _other_libraries(tree, package)
        rel = path.as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                for alias in node.names:
                    if not alias.name.startswith("_") or alias.name.startswith("__"):
                        continue
                    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                    if ".".join([*base, alias.name]) not in modules:
                        found.append(f"  {rel}:{node.lineno}: imports {alias.name} from {'.'.join(base)}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.endswith("_")
                and node.attr not in own
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and _root_name(node.value) not in theirs
                and "# other library:" not in lines[node.lineno - 1]
            ):
                found.append(f"  {rel}:{node.lineno}: reads {ast.unparse(node)[:60]}")
    return found


#: The rooms from the top layer down, as docs/architecture.md's map lists them: a module imports only modules of its own
#: room or of rooms after it (a module belongs to the room of its longest matching prefix).
ROOMS: tuple[tuple[str, ...], ...] = (
    ("", "cli", "demo"),  # the package root (the public face) and its commands
    ("notebook",),
    ("dask",),
    ("viz",),
    ("library",),
    ("_progress",),
    ("trace",),
    ("ops", "graphs", "pipeline"),
    ("pykernel",),
    ("device",),
    ("persistent",),
    ("kernels",),
    ("buffer", "streams", "_dispatch", "_memory", "ranges", "op_names"),
    ("listeners",),
    ("backends",),
    ("errors", "_format", "_version"),
)


def room_of(module: str, package: str = PACKAGE, rooms: tuple[tuple[str, ...], ...] = ROOMS) -> int | None:
    """The index in ``rooms`` of the room holding ``module`` (its longest matching prefix), None if none does."""
    best: tuple[int, int] | None = None
    for index, names in enumerate(rooms):
        for name in names:
            prefix = f"{package}.{name}" if name else package
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def upward_imports(
    imports: list[Import],
    named: set[tuple[str, str, str]],
    package: str = PACKAGE,
    rooms: tuple[tuple[str, ...], ...] = ROOMS,
) -> list[str]:
    """Imports (outside the named seams) of a module in a room listed before the importer's: against the order."""
    found = []
    for imp in imports:
        key = (imp.path.removeprefix(f"{package}/"), imp.function, imp.target.removeprefix(f"{package}."))
        low, high = room_of(imp.module, package, rooms), room_of(imp.target, package, rooms)
        if key not in named and low is not None and high is not None and high < low:
            found.append(f"  {imp.path}:{imp.line} imports {imp.target}, a room above its own")
    return found


def test_imports_go_down_the_map() -> None:
    unplaced = [m for m in MODULES if room_of(m) is None]
    assert not unplaced, f"modules in no room of ROOMS (and of docs/architecture.md's map): {unplaced}"
    found = upward_imports(IMPORTS, named_seams(ARCHITECTURE.read_text(encoding="utf-8")))
    assert not found, "imports against the map's order:\n" + "\n".join(found)


def test_without_the_named_seams_no_import_forms_a_cycle() -> None:
    named = named_seams(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(named) <= MAX_SEAMS, f"{len(named)} seams named; at most {MAX_SEAMS}: {sorted(named)}"
    cycle = find_cycle(full_graph(IMPORTS, named))
    assert cycle is None, "imports (inside functions too) form a cycle: " + " → ".join(cycle or [])


def test_each_room_imports_only_what_it_may() -> None:
    breaks = rule_breaks(IMPORTS, named_seams(ARCHITECTURE.read_text(encoding="utf-8")))
    assert not breaks, "imports that break the layering:\n" + "\n".join(breaks)


def test_no_module_runs_past_600_lines() -> None:
    found = long_modules(MODULES)
    assert not found, f"modules over {MAX_LINES} lines (split them by concept):\n" + "\n".join(found)


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found = private_reaches(MODULES)
    assert not found, "private names of other modules used (make them public):\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------------- the checks can fail
def test_find_cycle_spells_out_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    diamond = {"top": {"left", "right"}, "left": {"bottom"}, "right": {"bottom"}, "bottom": set()}
    assert find_cycle(diamond) is None


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_real_cycle_in_a_package_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from .c import C\n",
            "pkg/b.py": "try:\n    from .sub.c import C\nexcept ImportError:\n    C = None\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "import numpy\nfrom .. import a\n",
        },
    )
    modules = find_modules(tmp_path / "pkg", "pkg")
    imports = read_imports(modules, tmp_path, "pkg")
    # b's import of sub.c runs pkg/sub/__init__ first; the edge b → sub.c comes first in sorted order
    assert find_cycle(module_graph(imports)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]


def test_an_unnamed_seam_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .high import High\n"
                "class Low:\n    def make(self):\n        from .high import High\n        return High()\n"
                "def lazy():\n    import pkg.other\n"
                "def hook():\n    import sys\n    m = sys.modules.get('lib.sub')\n    m.f = print\n"
                "    own = sys.modules.get('pkg.mid')\n    own.x = 1\n"
            ),
            "pkg/mid.py": "from .low import Low\n",
            "pkg/high.py": "from . import mid\nclass High: ...\n",
            "pkg/other.py": "import json\n",
        },
    )
    modules = find_modules(tmp_path / "pkg", "pkg")
    imports = read_imports(modules, tmp_path, "pkg")
    assert find_cycle(module_graph(imports)) is None
    seams = find_seams(imports)
    assert [(s.imp.path, s.imp.line, s.imp.function, s.imp.target, s.chain) for s in seams] == [
        ("pkg/low.py", 6, "Low.make", "pkg.high", ("pkg.high", "pkg.mid", "pkg.low"))
    ]  # `lazy` defers an import that does not reach up: not a seam
    assert seam_problems(seams, {("low.py", "Low.make", "high")}, "pkg") == []
    problems = seam_problems(seams, {("low.py", "Low.lazy", "other")}, "pkg")
    assert problems == [
        "  pkg/low.py:6 Low.make imports pkg.high, which leads back (pkg.high → pkg.mid → pkg.low):"
        " name it, a row | `low.py` | `Low.make` | `high` | why |",
        "  a row names a seam the code no longer has: ('low.py', 'Low.lazy', 'other')",
    ]
    assert find_patches(modules, tmp_path, "pkg") == [("pkg/low.py", 13, "hook", "lib.sub.f")]  # not pkg's own


def test_seams_table_is_read() -> None:
    text = (
        "## Layers\n\n| `x.py` | `f` | `y` | not here |\n\n## Seams\n\nWords.\n\n"
        "| file | function | imports | why |\n|---|---|---|---|\n"
        "| `device.py` | `Device.alloc` | `buffer` | builds a Buffer |\n"
        "| `trace/recorder.py` | `Trace.show` | `viz`, `viz.timeline` | pictures |\n\n"
        "## Next\n| `z.py` | `g` | `w` | |\n"
    )
    assert named_seams(text) == {
        ("device.py", "Device.alloc", "buffer"),
        ("trace/recorder.py", "Trace.show", "viz"),
        ("trace/recorder.py", "Trace.show", "viz.timeline"),
    }
    with pytest.raises(AssertionError, match="no '## Seams' section"):
        named_seams("## Layers\n")


def test_the_rules_find_what_breaks_them(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .device import Device\n",
            "pkg/device.py": "def f():\n    from .trace import recorder\n    import pkg\n",
            "pkg/trace/__init__.py": "",
            "pkg/trace/recorder.py": "from ..viz import draw\ndef seam():\n    from .. import viz\n",
            "pkg/viz/__init__.py": "",
            "pkg/viz/draw.py": "from ..backends import cuda\n",
            "pkg/backends/__init__.py": "",
            "pkg/backends/cuda.py": "from .. import device\nfrom ..errors import E\n",
            "pkg/errors.py": "class E(Exception): ...\n",
            "pkg/other.py": (
                "import torch\nfrom .device import _private, f\nx = f.__name__\ny = f._hidden\n_z = 1\nw = f._z\n"
                "t = torch._C._x\nq = f._wgpu  # other library: wgpu-py\n"
            ),
        },
    )
    modules = find_modules(tmp_path / "pkg", "pkg")
    imports = read_imports(modules, tmp_path, "pkg")
    named = {("trace/recorder.py", "seam", "viz")}
    breaks = "\n".join(rule_breaks(imports, named, "pkg"))
    assert "pkg/device.py:2 imports pkg.trace.recorder: the core never imports the tracer" in breaks
    assert "pkg/device.py:3 imports pkg: the package root" in breaks
    assert "pkg/trace/recorder.py:1 imports pkg.viz.draw: the tracer" in breaks
    assert "recorder.py:3" not in breaks  # the named seam
    assert "pkg/viz/draw.py:1 imports pkg.backends.cuda: the pictures know no backend" in breaks
    assert "pkg/backends/cuda.py:1 imports pkg.device: a backend" in breaks
    assert "cuda.py:2" not in breaks
    assert full_graph(imports, named)["pkg.device"] >= {"pkg.trace.recorder", "pkg"}
    reaches = "\n".join(r.split("pkg/", 1)[1] for r in private_reaches(modules, "pkg"))
    assert reaches == "other.py:2: imports _private from pkg.device\nother.py:4: reads f._hidden"
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "pkg" / "table.py").write_text("# a table: long by nature\n" + "x = 1\n" * 700)
    long = long_modules(find_modules(tmp_path / "pkg", "pkg"))
    assert [line.rsplit("/", 1)[1] for line in long] == ["long.py: 601 lines"]


def test_an_import_up_the_map_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from . import top\n",
            "pkg/top.py": "from .low import f\n",
            "pkg/low.py": "def f():\n    from .top import g\ndef seam():\n    from . import top\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "from .. import low\n",
        },
    )
    modules = find_modules(tmp_path / "pkg", "pkg")
    rooms = (("",), ("top",), ("sub",), ("low",))
    assert [room_of(m, "pkg", rooms) for m in sorted(modules)] == [0, 3, 2, 2, 1]
    found = upward_imports(read_imports(modules, tmp_path, "pkg"), {("low.py", "seam", "top")}, "pkg", rooms)
    assert [line.split("pkg/", 1)[1] for line in found] == ["low.py:2 imports pkg.top, a room above its own"]

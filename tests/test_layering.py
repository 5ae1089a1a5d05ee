"""The package's "may import" rules (docs/architecture.md), checked on the source with `ast`.

Every `import` of a pdctl module counts, function-local ones too; imports under `if TYPE_CHECKING:` do not (they
never run), except inside the router, whose stages (ROUTER_STAGES) may not name a stage above them even for a
type, and between the folders of pdctl.lifecycle and pdctl.bench (FOLDER_STAGES), likewise. A rule broken today
and being fixed is listed in KNOWN_VIOLATIONS; the test fails on any other violation, and on a listed one that no
longer occurs, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pdctl"

# Modules that import no other pdctl module but leaves (`pdctl` itself: the package, for __version__).
LEAVES = ("pdctl", "pdctl.errors", "pdctl.secret", "pdctl.kv_expiry", "pdctl.defaults", "pdctl.markers",
          "pdctl.topology.strings", "pdctl.topology.bounded_yaml", "pdctl.vllm_compat", "pdctl.vllm_compat.edits",
          "pdctl.engine_metrics", "pdctl.examples", "pdctl.fasthttp")
# What the router may import from the rest of pdctl: it stands apart and talks HTTP.
ROUTER_LEAVES = ("pdctl", "pdctl.errors", "pdctl.kv_expiry", "pdctl.secret", "pdctl.defaults", "pdctl.prefix_check",
                 "pdctl.fasthttp")
# The router's public surface, for everything outside pdctl/router/ (serve: its entry point, `router_app`).
ROUTER_PUBLIC = ("pdctl.router", "pdctl.router.wire", "pdctl.router.config", "pdctl.router.serve")

# The router's own stages, from the bottom: each imports only its own and lower stages, type-only imports included.
# A module belongs to the first stage one of whose names it is or is inside of; every router module has one.
ROUTER_STAGES: tuple[tuple[str, ...], ...] = (
    ("pdctl.router", "pdctl.router.wire", "pdctl.router.reasons", "pdctl.router.documents", "pdctl.router.config",
     "pdctl.router.errors", "pdctl.router.jsonx", "pdctl.router.lean_metrics"),
    ("pdctl.router.upstream",),
    ("pdctl.router.kv",),
    ("pdctl.router.turn",),
    ("pdctl.router.api",),
    ("pdctl.router.server", "pdctl.router.serve", "pdctl.router.__main__"),
)

# The folders of pdctl.lifecycle and pdctl.bench, from the bottom: a module imports only its own and lower folders
# of its package (type-only imports included); the package's own top (its __init__, the bench's session) is last.
# A module belongs to the first stage one of whose names it is or is inside of; every module of the package has one.
FOLDER_STAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "pdctl.lifecycle": (
        ("pdctl.lifecycle.hosts",),
        ("pdctl.lifecycle.changes",),
        ("pdctl.lifecycle.bringup",),
        ("pdctl.lifecycle.watch",),
        ("pdctl.lifecycle",),
    ),
    "pdctl.bench": (
        ("pdctl.bench.results",),
        ("pdctl.bench.traffic",),
        ("pdctl.bench.leg",),
        ("pdctl.bench.runner",),
        ("pdctl.bench.output",),
        ("pdctl.bench", "pdctl.bench.session"),
    ),
}

# Lower layers never import higher ones; a module belongs to the first layer one of whose prefixes it matches.
# pdctl.sim is in no layer: it imports nothing of pdctl (sim-stands-apart).
LAYERS: tuple[tuple[str, ...], ...] = (
    LEAVES,
    ("pdctl.router",),
    ("pdctl.topology",),
    ("pdctl.plan", "pdctl.plan_view", "pdctl.state"),
    ("pdctl.remote",),
    ("pdctl.facts",),
    ("pdctl.operations",),
    ("pdctl.slurm",),
    ("pdctl.lifecycle",),
    ("pdctl.bench",),
    ("pdctl.demo", "pdctl.demo_summary"),
    ("pdctl.cli", "pdctl.__main__"),
)

# Broken today, each being fixed by the helper named; the lead removes an entry once its fix is merged.
# Key: "<rule>: <importing module> -> <imported module>", or "cycle: <modules of one import cycle, sorted>".
KNOWN_VIOLATIONS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported pdctl module (a submodule where `from pkg import name` names one)
    where: str  # file:line

    def key(self, rule: str) -> str:
        return f"{rule}: {self.source} -> {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST, typing: bool = False) -> Iterator[ast.AST]:
    """Every node, leaving out the bodies of `if TYPE_CHECKING:` (their `else:` still runs) unless `typing`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child) and not typing:
            for sub in child.orelse:
                yield sub
                yield from _nodes(sub)
            continue
        yield child
        yield from _nodes(child, typing)


def _known(name: str) -> str | None:
    """The pdctl module `name` is, or is inside of (a name imported from a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(source: str, text: str | None = None, typing: bool = False) -> list[Import]:
    path = MODULES.get(source, ROOT / (source.replace(".", "/") + ".py"))
    is_pkg = path.name == "__init__.py"
    out: list[Import] = []
    tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text, str(path))
    for node in _nodes(tree, typing):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = source.split(".")[: len(source.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = _known(name) if name.split(".")[0] == "pdctl" else None
            if target is not None and target != source:
                out.append(Import(source, target, where))
    return out


IMPORTS = list(dict.fromkeys(i for m in MODULES for i in imports_of(m)))  # `from m import a, b` counts once
# The router's imports of its own modules, type-only ones too.
ROUTER_IMPORTS = [i for i in dict.fromkeys(i for m in MODULES if m.startswith("pdctl.router")
                                           for i in imports_of(m, typing=True)) if i.target.startswith("pdctl.router")]


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def sim_stands_apart() -> Iterator[tuple[str, Import]]:
    for i in IMPORTS:
        # pdctl.prefix_check is the prefill's side of verification, which vLLM gets as a copy of the same file;
        # pdctl.fasthttp is a transport for httpx that imports nothing of pdctl (the side channel's client).
        if (_inside(i.source, "pdctl.sim") and not _inside(i.target, "pdctl.sim")
                and i.target not in ("pdctl.prefix_check", "pdctl.fasthttp")):
            yield "sim-stands-apart", i
        if _inside(i.source, "pdctl.vllm_compat") and not _inside(i.target, "pdctl.vllm_compat"):
            yield "sim-stands-apart", i


def router_imports_leaves_only() -> Iterator[tuple[str, Import]]:
    for i in IMPORTS:
        if _inside(i.source, "pdctl.router") and not _inside(i.target, "pdctl.router") \
                and i.target not in ROUTER_LEAVES:
            yield "router-imports-leaves-only", i


def router_public_only() -> Iterator[tuple[str, Import]]:
    for i in IMPORTS:
        if not _inside(i.source, "pdctl.router") and _inside(i.target, "pdctl.router") \
                and i.target not in ROUTER_PUBLIC:
            yield "router-public-only", i


def cli_is_top() -> Iterator[tuple[str, Import]]:
    for i in IMPORTS:
        if _inside(i.target, "pdctl.cli") and not _inside(i.source, "pdctl.cli") and i.source != "pdctl.__main__":
            yield "cli-is-top", i


def layer(module: str) -> int:
    for n, prefixes in enumerate(LAYERS):
        if module in prefixes or any(_inside(module, p) for p in prefixes if p != "pdctl"):
            return n
    return -1  # pdctl.sim: rule sim-stands-apart


def layers() -> Iterator[tuple[str, Import]]:
    for i in IMPORTS:
        if layer(i.target) > layer(i.source) >= 0:
            yield "layers", i


def router_stage(module: str) -> int:
    """The router stage `module` is in (an index into ROUTER_STAGES); -1 for none."""
    for n, names in enumerate(ROUTER_STAGES):
        if module in names or any(_inside(module, s) for s in names if s != "pdctl.router"):
            return n
    return -1


def folder_stage(package: str, module: str) -> int:
    """The folder of `package` (a key of FOLDER_STAGES) that `module` is in, as an index; -1 for none. The package
    itself and its flat modules are named exactly; a folder holds everything inside it."""
    for n, names in enumerate(FOLDER_STAGES[package]):
        if module in names or any(_inside(module, s) for s in names if s != package):
            return n
    return -1


def folder_imports(package: str) -> list[Import]:
    """`package`'s imports of its own modules, type-only ones too."""
    return [i for i in dict.fromkeys(i for m in MODULES if _inside(m, package) for i in imports_of(m, typing=True))
            if _inside(i.target, package)]


def folders(imports: dict[str, list[Import]] | None = None) -> Iterator[tuple[str, Import]]:
    """One-way arrows between the folders of pdctl.lifecycle and pdctl.bench: never to a folder above."""
    for package in FOLDER_STAGES:
        for i in folder_imports(package) if imports is None else imports.get(package, []):
            if folder_stage(package, i.target) > folder_stage(package, i.source):
                yield "folders", i


def router_stages() -> Iterator[tuple[str, Import]]:
    for i in ROUTER_IMPORTS:
        if router_stage(i.target) > router_stage(i.source):
            yield "router-stages", i


def cycles(imports: list[Import] | None = None) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS if imports is None else imports:
        edges[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    return found


RULES: dict[str, Callable[[], Iterator[tuple[str, Import]]]] = {
    "sim-stands-apart": sim_stands_apart,
    "router-imports-leaves-only": router_imports_leaves_only,
    "router-public-only": router_public_only,
    "cli-is-top": cli_is_top,
    "layers": layers,
    "router-stages": router_stages,
    "folders": folders,
}


def _check(found: dict[str, str], rule: str) -> None:
    known = {k for k in KNOWN_VIOLATIONS if k.startswith(rule + ":")}
    new = [f"{where}: {key}" for key, where in sorted(found.items()) if key not in known]
    gone = sorted(known - set(found))
    assert not new and not gone, "\n".join(
        [f"{rule} broken (fix the import, or see docs/architecture.md):", *new]
        + ([f"no longer broken, remove from KNOWN_VIOLATIONS in {Path(__file__).name}:", *gone] if gone else []))


@pytest.mark.parametrize("rule", list(RULES))
def test_import_rule(rule: str) -> None:
    found: dict[str, str] = {}
    for name, i in RULES[rule]():
        found.setdefault(i.key(name), i.where)
    _check(found, rule)


def test_no_import_cycles() -> None:
    found: dict[str, str] = {}
    for scc in cycles():
        members = set(scc)
        hops = [f"{i.where} ({i.source} -> {i.target})" for i in IMPORTS if i.source in members and i.target in members]
        found[f"cycle: {', '.join(scc)}"] = "; ".join(hops)
    _check(found, "cycle")


def test_every_router_module_has_a_stage() -> None:
    """A new router module is placed in a stage on purpose (a folder, or ROUTER_STAGES' base), not by accident."""
    stray = [m for m in MODULES if _inside(m, "pdctl.router") and router_stage(m) < 0]
    assert not stray, f"router modules in no stage of ROUTER_STAGES: {stray}"
    assert {router_stage(m) for m in MODULES if _inside(m, "pdctl.router")} == set(range(len(ROUTER_STAGES)))


def test_the_router_has_no_import_cycle_even_through_types() -> None:
    found = cycles(ROUTER_IMPORTS)
    assert not found, "router import cycles (type-only imports included): " + "; ".join(", ".join(c) for c in found)


def test_the_router_checks_see_type_only_imports_that_run_back_up() -> None:
    """The router's rules count `if TYPE_CHECKING:` imports (the other rules do not), so a type named from a stage
    above, or a circle closed through one, fails."""
    text = """
from typing import TYPE_CHECKING
from pdctl.router.kv.handles import Handle
if TYPE_CHECKING:
    from pdctl.router.server.routes import Route
"""
    source = "pdctl.router.turn.context"
    plain = [i.target for i in imports_of(source, text)]
    typed = imports_of(source, text, typing=True)
    assert plain == ["pdctl.router.kv.handles"]
    assert [(i.target, router_stage(i.target) > router_stage(i.source)) for i in typed] == [
        ("pdctl.router.kv.handles", False), ("pdctl.router.server.routes", True)]
    back = Import("pdctl.router.server.routes", source, "x:1")
    assert cycles([*typed, back]) == [sorted([source, "pdctl.router.server.routes"])]
    assert len(ROUTER_IMPORTS) > 150


def test_the_checker_sees_imports() -> None:
    """The rules above pass vacuously if the parser finds nothing; it finds the imports it must, and only those."""
    text = """
from typing import TYPE_CHECKING
import pdctl.plan
from pdctl.router.turn import decode, RequestContext
from . import wait
if TYPE_CHECKING:
    from pdctl.cli import root
else:
    from pdctl import errors
def f():
    from pdctl.remote.procs import kill_script, parse_ps
"""
    found = [(i.target, int(i.where.rpartition(":")[2])) for i in imports_of("pdctl.lifecycle.hosts.example", text)]
    assert list(dict.fromkeys(found)) == [
        ("pdctl.plan", 3), ("pdctl.router.turn.decode", 4), ("pdctl.router.turn", 4), ("pdctl.lifecycle.hosts.wait", 5),
        ("pdctl.errors", 9), ("pdctl.remote.procs", 11)]
    assert len(MODULES) > 100 and len(IMPORTS) > 300


@pytest.mark.parametrize("package", list(FOLDER_STAGES))
def test_every_module_is_in_a_folder(package: str) -> None:
    """A new module of pdctl.lifecycle or pdctl.bench is placed in a folder on purpose, not left flat by accident;
    every folder named exists."""
    stray = [m for m in MODULES if _inside(m, package) and folder_stage(package, m) < 0]
    assert not stray, f"{package} modules in no folder of FOLDER_STAGES: {stray}"
    assert {folder_stage(package, m) for m in MODULES if _inside(m, package)} == set(range(len(FOLDER_STAGES[package])))


@pytest.mark.parametrize("package", list(FOLDER_STAGES))
def test_folders_have_no_import_cycle_even_through_types(package: str) -> None:
    found = cycles(folder_imports(package))
    assert not found, f"{package} import cycles (type-only imports included): " + "; ".join(", ".join(c) for c in found)


def test_the_folder_rule_fails_on_an_upward_import() -> None:
    """A planted import from a lower folder to a higher one (the host layer naming `status`, the records naming the
    report) breaks the rule; the same import downward, and one within a folder, do not."""
    text = """
from pdctl.lifecycle.watch.status import status
from pdctl.lifecycle.hosts import wait
"""
    planted = imports_of("pdctl.lifecycle.hosts.launch", text, typing=True)
    assert [i.target for i in planted] == ["pdctl.lifecycle.watch.status", "pdctl.lifecycle.hosts.wait"]
    bench = imports_of("pdctl.bench.results.records", "from pdctl.bench.output import report\n", typing=True)
    down = imports_of("pdctl.bench.output.report", "from pdctl.bench.results import records\n", typing=True)
    found = [(rule, i.source, i.target) for rule, i in folders(
        {"pdctl.lifecycle": [*folder_imports("pdctl.lifecycle"), *planted],
         "pdctl.bench": [*folder_imports("pdctl.bench"), *bench, *down]})]
    assert found == [("folders", "pdctl.lifecycle.hosts.launch", "pdctl.lifecycle.watch.status"),
                     ("folders", "pdctl.bench.results.records", "pdctl.bench.output.report")]
    # and the test that runs the rule reports it
    with pytest.raises(AssertionError, match="folders broken"):
        _check({i.key(rule): i.where for rule, i in folders({"pdctl.bench": bench})}, "folders")
    assert len(folder_imports("pdctl.lifecycle")) > 40 and len(folder_imports("pdctl.bench")) > 40

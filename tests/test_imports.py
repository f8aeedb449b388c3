"""The layering of DESIGN.md ("imports only go down this list"), checked on the source without importing it.

Every module of the packages ``agentjax`` and ``envs`` is parsed with ``ast``; each ``import`` statement, at module
level, under ``if TYPE_CHECKING:`` or inside a function, is an edge from its module to the module it names
(relative imports resolved; ``from pkg import name`` goes to ``pkg.name`` when that is a submodule, else to ``pkg``).
On that graph: no import cycles (a function-level import does not hide one), ``credit`` imports neither ``losses`` nor
``models``, ``envs`` imports neither ``jax`` nor ``agentjax``, ``rollout`` and ``agents`` never import ``models``
(the collectors talk to the policy through :mod:`agentjax.rollout.policy`, which ``models`` implements: ``models``
imports ``rollout`` only there), and ``agents`` never imports ``rollout``.
"""

import ast
import functools
import pathlib
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("agentjax", "envs")

POLICY_PROTOCOL = "agentjax.rollout.policy"  # what `models` may import of `rollout`


class Import(NamedTuple):
    source: str  # the importing module, dotted
    target: str  # the imported module: a project module, else the name as written (a third-party module)
    line: int
    lazy: bool  # inside a function body


def module_files() -> dict[str, pathlib.Path]:
    """Every project module by dotted name (a package by its ``__init__.py``)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports_of(module: str, source: str, *, is_package: bool, known) -> list[Import]:
    """The imports in ``source``, the text of ``module``; ``known``: the project's module names."""
    package = module if is_package else module.rpartition(".")[0]

    def resolve(name: str) -> str:  # the longest prefix that is a project module (`import a.b.f`, f a function: a.b)
        parts = name.split(".")
        prefixes = (".".join(parts[:end]) for end in range(len(parts), 0, -1))
        return next((p for p in prefixes if p in known), name)

    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, resolve(alias.name), node.lineno, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..x import y` in a.b.c: a.x
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + [base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append(Import(module, submodule if submodule in known else resolve(base), node.lineno, lazy))
        lazy = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, lazy)

    visit(ast.parse(source), False)
    return found


@functools.cache
def all_imports() -> tuple[Import, ...]:
    files = module_files()
    return tuple(imp for module, path in files.items()
                 for imp in imports_of(module, path.read_text(), is_package=path.name == "__init__.py", known=files))


def project_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (itself left out)."""
    graph = {module: set() for module in module_files()}
    for imp in all_imports():
        if imp.target in graph and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v is the root of a component: pop it
            component = set()
            while v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def edges(sources: str, targets: str) -> set[tuple[str, str]]:
    """(importing module, imported module) for the imports from package ``sources`` into package ``targets``."""
    return {(imp.source, imp.target) for imp in all_imports()
            if within(imp.source, sources) and within(imp.target, targets)}


def test_the_parser_resolves_relative_submodule_and_lazy_imports():
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c"}
    source = (
        "import p.a\n"
        "from p import b, helper\n"
        "from . import c\n"
        "from ..a import f\n"
        "import numpy.linalg\n"
        "if TYPE_CHECKING:\n"
        "    from p.b import T\n"
        "def g():\n"
        "    from .c import h\n"
    )
    found = imports_of("p.sub.d", source, is_package=False, known=known)
    assert [(imp.target, imp.lazy) for imp in found] == [
        ("p.a", False), ("p.b", False), ("p", False), ("p.sub.c", False), ("p.a", False), ("numpy.linalg", False),
        ("p.b", False), ("p.sub.c", True),
    ]
    assert [imp.target for imp in imports_of("p.sub", "from . import c", is_package=True, known=known)] == ["p.sub.c"]


def test_the_cycle_finder():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert cycles(graph) == {frozenset("abc"), frozenset("de")}


def test_no_import_cycles():
    found = cycles(project_graph())
    assert not found, f"import cycles (fix them): {sorted(sorted(c) for c in found)}"


def test_credit_imports_neither_losses_nor_models():
    assert edges("agentjax.credit", "agentjax.losses") | edges("agentjax.credit", "agentjax.models") == set()


def test_envs_import_neither_jax_nor_agentjax():
    jax_and_its_libraries = ("jax", "jaxlib", "flax", "optax", "chex", "orbax")
    assert set().union(*(edges("envs", name) for name in (*jax_and_its_libraries, "agentjax"))) == set()


def test_rollout_and_agents_never_import_models():
    assert edges("agentjax.rollout", "agentjax.models") | edges("agentjax.agents", "agentjax.models") == set()


def test_agents_never_import_rollout():
    assert edges("agentjax.agents", "agentjax.rollout") == set()


def test_models_import_rollout_only_for_the_policy_protocol():
    found = {target for _, target in edges("agentjax.models", "agentjax.rollout")}
    assert found <= {POLICY_PROTOCOL}, f"models imports {sorted(found - {POLICY_PROTOCOL})} of rollout"

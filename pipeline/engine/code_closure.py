"""The project code a stage runs, found from its imports: what enters its fingerprint as source.

A stage's fingerprint must change when any code that shapes its rows changes, including helpers
several modules deep. A list written by hand goes stale and then hides an edit, so the modules are
read off the code: the stage's module (and its method's), then every project module they import,
transitively, walking each module's AST. Project modules are those of the root's own top-level
package (`stages`, or `tests` for the test suite's toy stages) and of `pipeline`.

Framework modules of `pipeline` that run a stage without deciding its rows (pipeline.engine and
pipeline.llm whole, artifacts, config) are left out and not walked: editing the retry loop must not
invalidate every stage. A new `pipeline` module outside those two packages enters by default, the
safe side.
"""

from __future__ import annotations

import ast
import importlib.util

from pipeline.hashing import sha256

FRAMEWORK = "pipeline"
# What runs stages but does not shape what they write (its effects enter elsewhere: the LLM's
# identity through the role's answer identity, settings through the config section): the engine and
# the LLM layer whole, and these modules beside them.
RUNS_NOT_SHAPES_PACKAGES = ("pipeline.engine", "pipeline.llm")
RUNS_NOT_SHAPES = frozenset({
    "pipeline", "pipeline.artifacts", "pipeline.cli", "pipeline.config", "pipeline.errors", "pipeline.export",
    "pipeline.hashing", "pipeline.manifest", "pipeline.models_needed", "pipeline.model_fetch", "pipeline.simulation",
})


def runs_not_shapes(module: str) -> bool:
    """Whether a framework module only runs stages (never in a fingerprint)."""
    return module in RUNS_NOT_SHAPES or any(module == p or module.startswith(p + ".") for p in RUNS_NOT_SHAPES_PACKAGES)


def read_source(module: str) -> str:
    """The source text of a module (a package's `__init__.py`)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ImportError(f"no Python source for module {module!r}")
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is not a package, e.g. `pkg.module.attr`
        return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool, projects: frozenset[str]) -> set[str]:
    """Modules a module imports at run time (at top level or inside functions; not the imports
    under `if TYPE_CHECKING:`, which never run). `from pkg import name` names the submodule
    `pkg.name` when there is one, else `pkg` itself (parent packages are not counted: importing
    `stages.methods.creem` runs `stages/__init__.py`, whose code does not shape CREEM's rows)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    projects = projects | {module.partition(".")[0], FRAMEWORK}

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            if base.partition(".")[0] not in projects:  # a library: only its name matters here
                found.add(base)
                return
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if alias.name != "*" and _is_module(sub) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


# Parsed once per process (a run fingerprints every stage, each over the closure of its modules);
# `forget` drops an entry whose source changed.
_IMPORTS: dict[tuple[str, frozenset[str]], frozenset[str]] = {}
_HASHES: dict[str, str] = {}


def imports_of(module: str, projects: frozenset[str] = frozenset()) -> frozenset[str]:
    """What `module` imports; `from pkg import name` is resolved to the submodule `pkg.name` for the
    packages of `projects` (and the module's own and the framework's), not for libraries."""
    key = (module, projects)
    if key not in _IMPORTS:
        spec = importlib.util.find_spec(module)
        is_package = bool(spec and spec.submodule_search_locations)
        _IMPORTS[key] = frozenset(_imported(ast.parse(read_source(module)), module, is_package, projects))
    return _IMPORTS[key]


def in_scope(module: str, projects: frozenset[str]) -> bool:
    top = module.partition(".")[0]
    if top == FRAMEWORK:
        return not runs_not_shapes(module)
    return top in projects


def code_closure(*roots: str) -> list[str]:
    """The roots and every project module they import, transitively, sorted by name. The project is
    every root's top-level package: a method from another package (its stage rooted in `stages` and in
    its own module) brings in its package's modules and the `stages` helpers it imports."""
    projects = frozenset(root.partition(".")[0] for root in roots)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [m for m in imports_of(module, projects) if m not in seen and in_scope(m, projects)]
    return sorted(seen)


def source_hash(module: str) -> str:
    if module not in _HASHES:
        _HASHES[module] = sha256(read_source(module))
    return _HASHES[module]


def code_hashes(*roots: str) -> dict[str, str]:
    """Module name -> hash of its source, over `code_closure(*roots)`: a stage's "code"."""
    return {m: source_hash(m) for m in code_closure(*roots)}


def forget(*modules: str) -> None:
    """Drop the parsed imports and source hashes of `modules` (of every module when none is named),
    after their source changed within one process."""
    if not modules:
        _IMPORTS.clear()
        _HASHES.clear()
        return
    for key in [k for k in _IMPORTS if k[0] in modules]:
        del _IMPORTS[key]
    for module in modules:
        _HASHES.pop(module, None)

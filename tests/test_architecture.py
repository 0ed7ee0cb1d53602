"""The layers hold without hidden imports: import-linter's contracts (setup.cfg) are kept, an
import inside a function only defers a heavy optional dependency (and says so), and no bertjax
module imports itself back through others."""

import ast
import io
import os
import subprocess
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "bertjax")

# Third-party packages heavy enough, and needed on few enough paths, that importing them at the
# top of a module would slow every command down (or they are optional extras).
DEFERRABLE = frozenset({"torch", "transformers", "tensorflow", "tensorflow_datasets", "faiss",
                        "bm25s", "Stemmer", "sklearn", "matplotlib", "tensorboardX",
                        "google", "rdata"})
# `bertjax.load` imports the Python API when called, so that `import bertjax` stays free of JAX
# (and quick, for a command that needs none of it).
LAZY_ROOT_API = ("bertjax/__init__.py", "bertjax.inference.api")


def _modules() -> dict[str, str]:
    """Module name -> path, for every module under bertjax/."""
    modules = {}
    for directory, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                name = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
                modules[name.removesuffix(".__init__")] = path
    return modules


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _imported_modules(module: str, path: str, node: ast.Import | ast.ImportFrom,
                      modules: dict[str, str]) -> set[str]:
    """The bertjax modules an import statement names: `from package import module` names that
    module, `from module import name` the module."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            keep = len(parts) - node.level + (1 if path.endswith("__init__.py") else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                 for alias in node.names]
    found = set()
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules:
            found.add(name)
    return found


def _top_level_packages(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The distributions an import reaches into ("." for a relative import: bertjax's own)."""
    if isinstance(node, ast.ImportFrom):
        return {"." if node.level else node.module.split(".")[0]}
    return {alias.name.split(".")[0] for alias in node.names}


def _imports_in_functions(tree: ast.Module):
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def _comment_lines(source: str) -> set[int]:
    return {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT}


def _first_of_import_run(lines: list[str], lineno: int) -> int:
    """The first line of the run of import lines that `lineno` ends: one comment above a run of
    deferred imports speaks for all of them."""
    while lineno > 1 and lines[lineno - 2].lstrip().startswith(("import ", "from ")):
        lineno -= 1
    return lineno


def _lint_imports_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]


def test_the_import_contracts_are_kept():
    """lint-imports, run from the repository root, reads the contracts from setup.cfg (the first
    file it looks in)."""
    result = subprocess.run(_lint_imports_command() + ["--no-cache"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_imports_inside_functions_only_defer_heavy_optional_packages():
    wrong = []
    for path in sorted(_modules().values()):
        source = _read(path)
        comments, lines = _comment_lines(source), source.splitlines()
        relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
        for node in sorted(_imports_in_functions(ast.parse(source)), key=lambda n: n.lineno):
            where = f"{relative}:{node.lineno}: {ast.unparse(node)}"
            if (relative, getattr(node, "module", None)) == LAZY_ROOT_API:
                continue
            if not _top_level_packages(node) <= DEFERRABLE:
                wrong.append(f"{where} (not a heavy optional package: import it at the top)")
            elif not set(range(_first_of_import_run(lines, node.lineno) - 1, node.lineno + 1)) \
                    & comments:
                wrong.append(f"{where} (say why it is deferred, in a comment on it or above it)")
    assert not wrong, "\n".join(wrong)


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def test_no_module_imports_itself_back():
    """Every import counts, inside functions and under `if TYPE_CHECKING:` too: a cycle is a
    design knot wherever its imports sit."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(_read(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= _imported_modules(module, path, node, modules) - {module}
    cycles = _sccs(graph)
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)

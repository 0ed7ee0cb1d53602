"""The README and the pages under docs/ point at things that exist.

Every relative link resolves (the file, and a `#anchor` to a heading of the target page by
GitHub's slug rules); every `python -m bertjax.X` names a runnable module; every `configs/NAME.py`
(and its `:preset`) exists; every path into the repository they mention exists. Read as text
only: no imports of bertjax, no subprocesses.
"""

from __future__ import annotations

import ast
import functools
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_DIR = os.path.join(ROOT, "docs")

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
DOTTED_NAME = re.compile(r"(?<![\w./])bertjax(?:\.[A-Za-z_]\w*)+")
MODULE_RUN = re.compile(r"python3?\s+-m\s+(bertjax(?:\.[A-Za-z_]\w*)*)")
CONFIG_FILE = re.compile(r"(?<![\w/.-])configs/(\w+)\.py(?::([a-z0-9_]+))?")
# Paths into the repository: a file with an extension, or a folder written with its trailing '/'.
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:bertjax|tests|benchmarks|configs|launch|docs)/(?:[\w.-]+/)*(?:[\w-]+\.\w+)?)")


def doc_paths() -> list[str]:
    pages = sorted(os.path.join(DOCS_DIR, name) for name in os.listdir(DOCS_DIR)
                   if name.endswith(".md"))
    return [os.path.join(ROOT, "README.md")] + pages


@functools.lru_cache(maxsize=None)
def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (where '#' starts a comment, not a heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def code_blocks(text: str) -> list[str]:
    """The text of every fenced code block."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lower-cased, punctuation dropped
    (letters, digits, '_', '-' and spaces stay), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: str) -> frozenset[str]:
    """Every heading's anchor in a page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(read(path)):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


def relative_links(path: str) -> list[str]:
    # Link text may wrap onto the next line; a link inside a code span is shown, not followed.
    prose = CODE_SPAN.sub("code", "\n".join(prose_lines(read(path))))
    return [target for target in LINK.findall(prose) if not URL_SCHEME.match(target)]


def link_problem(page: str, target: str) -> str | None:
    """Why a relative link of `page` does not resolve, or None when it does."""
    file_part, _, anchor = target.partition("#")
    resolved = page if not file_part else os.path.normpath(
        os.path.join(os.path.dirname(page), file_part))
    if not resolved.startswith(ROOT + os.sep) or not os.path.exists(resolved):
        return "no such file"
    if anchor:
        if not resolved.endswith(".md"):
            return "an anchor into a file that is not a page"
        if anchor not in anchors(resolved):
            return f"no heading with the anchor #{anchor} in {os.path.relpath(resolved, ROOT)}"
    return None


def runnable(module: str) -> bool:
    base = os.path.join(ROOT, *module.split("."))
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py"))


@functools.lru_cache(maxsize=None)
def string_constants(path: str) -> frozenset[str]:
    tree = ast.parse(read(path))
    return frozenset(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str))


@functools.lru_cache(maxsize=None)
def top_level_names(path: str) -> frozenset[str]:
    """What a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(read(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)


def dotted_name_problem(name: str) -> str | None:
    """Why `bertjax.a.b.C` names nothing: its longest module prefix must define what follows."""
    parts = name.split(".")
    base = ROOT
    for index, part in enumerate(parts):
        package, module = os.path.join(base, part), os.path.join(base, part + ".py")
        if os.path.isdir(package):
            base = package
            continue
        if os.path.isfile(module):
            rest = parts[index + 1:]
            if rest and rest[0] not in top_level_names(module):
                return f"{os.path.relpath(module, ROOT)} defines no {rest[0]}"
            return None
        init = os.path.join(base, "__init__.py")
        if part.isupper() or (os.path.isfile(init) and part in top_level_names(init)):
            return None  # a placeholder such as bertjax.X, or what a package offers
        return f"no module or package {'.'.join(parts[:index + 1])}"
    return None


def problems_of(check) -> list[str]:
    problems = []
    for page in doc_paths():
        problems += [f"{os.path.relpath(page, ROOT)}: {problem}" for problem in check(page)]
    return problems


def test_the_pages_are_found():
    names = [os.path.relpath(path, ROOT) for path in doc_paths()]
    assert "README.md" in names and len(names) > 1, names


def test_relative_links_resolve():
    def check(page):
        for target in relative_links(page):
            problem = link_problem(page, target)
            if problem:
                yield f"({target}): {problem}"

    problems = problems_of(check)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_page_is_linked_from_the_readme():
    linked = {os.path.normpath(os.path.join(ROOT, target.partition("#")[0]))
              for target in relative_links(os.path.join(ROOT, "README.md"))}
    orphans = [os.path.relpath(page, ROOT) for page in doc_paths()[1:] if page not in linked]
    assert not orphans, f"pages the README does not link to: {orphans}"


def test_python_m_commands_name_runnable_modules():
    def check(page):
        for module in MODULE_RUN.findall(read(page)):
            if any(part.isupper() for part in module.split(".")):
                continue  # a placeholder, as in `python -m bertjax.X`
            if not runnable(module):
                yield (f"`python -m {module}`: neither {module.replace('.', '/')}.py nor "
                       f"{module.replace('.', '/')}/__main__.py exists")

    problems = problems_of(check)
    assert not problems, "\n".join(problems)


def test_code_blocks_run_documented_modules():
    # The commands a reader copies: at least the pretraining entry point is among them.
    modules = {module for page in doc_paths() for block in code_blocks(read(page))
               for module in MODULE_RUN.findall(block)}
    assert "bertjax.main" in modules, modules


def test_dotted_names_exist():
    def check(page):
        for name in DOTTED_NAME.findall(read(page)):
            problem = dotted_name_problem(name)
            if problem:
                yield f"{name}: {problem}"

    problems = problems_of(check)
    assert not problems, "\n".join(problems)


def test_configs_and_their_presets_exist():
    def check(page):
        for name, preset in CONFIG_FILE.findall(read(page)):
            path = os.path.join(ROOT, "configs", f"{name}.py")
            if not os.path.isfile(path):
                yield f"configs/{name}.py does not exist"
            elif preset and preset not in string_constants(path):
                yield f"configs/{name}.py has no preset {preset!r}"

    problems = problems_of(check)
    assert not problems, "\n".join(problems)


def test_repository_paths_exist():
    def check(page):
        for path in REPO_PATH.findall(read(page)):
            if not os.path.exists(os.path.join(ROOT, path)):
                yield f"{path} does not exist"

    problems = problems_of(check)
    assert not problems, "\n".join(problems)


def test_the_readme_keeps_the_two_set_up_commands():
    commands = [line.split("#")[0].strip()
                for block in code_blocks(read(os.path.join(ROOT, "README.md")))
                for line in block.splitlines()]
    assert "make demo" in commands and "make test" in commands, commands
    targets = re.findall(r"^([\w-]+):", read(os.path.join(ROOT, "Makefile")), re.MULTILINE)
    assert {"demo", "test"} <= set(targets), targets


@pytest.mark.parametrize("heading, slug", [
    ("Same recipe, same accuracy as transformers", "same-recipe-same-accuracy-as-transformers"),
    ("Using `bertjax.load`", "using-bertjaxload"),
    ("Export and Hugging Face", "export-and-hugging-face"),
    ("The 128 → 512 switch", "the-128--512-switch"),
    ("[Linked](x.md) heading_name", "linked-heading_name"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_a_broken_link_is_caught(tmp_path):
    page = os.path.join(DOCS_DIR, "architecture.md")
    assert link_problem(page, "pretraining.md") is None
    assert link_problem(page, "pretraining.md#objectives-compared") is None
    assert link_problem(page, "#tests") is None
    assert link_problem(page, "no-such-page.md") == "no such file"
    assert "no heading" in link_problem(page, "pretraining.md#no-such-heading")
    assert link_problem(page, "../../outside.md") == "no such file"


def test_a_stale_name_is_caught():
    assert dotted_name_problem("bertjax.wsd.wordnet.Example") is None
    assert dotted_name_problem("bertjax.load") is None
    assert (dotted_name_problem("bertjax.data.wordnet.Example")
            == "no module or package bertjax.data.wordnet")
    assert "defines no Nothing" in dotted_name_problem("bertjax.wsd.wordnet.Nothing")

#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a loop.

Reads every workspace crate's `src/` (test modules left out: files named `tests.rs` or
`test_support.rs`, folders named `tests`, and whatever follows a top-level `#[cfg(test)]`),
turns each `crate::a::b`, `super::x` and `self::x` path into an edge from the file that names it
to the file of the module it reaches, and prints every strongly connected component of two or
more files with the names that tie each pair. Exit status 1 when there is one, 0 when none.

    scripts/module_cycles.py                 # every crate of the workspace
    scripts/module_cycles.py shared infra    # the crates in those folders
    scripts/module_cycles.py --graph shared  # also print each crate's edges
    scripts/module_cycles.py --self-test     # the check checked against planted cycles

Written here rather than taken from crates.io: the tools that draw module graphs
(cargo-modules) need rust-analyzer's whole front end and take minutes to build, and this
check only needs the paths a file names, which is text.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A path that starts at the crate root or climbs from the current module.
PATH_START = re.compile(r"\b(crate|super|self)::")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\*")
TEST_GATE = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:#\[[^\n]*\]\s*\n)*mod\s+\w+\s*\{", re.M)
TEST_DECL = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:#\[[^\n]*\]\s*\n)*mod\s+(\w+)\s*;", re.M)
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"b?'(?:\\.[^']*|[^'\\\n])'")


def strip(text: str) -> str:
    """Source without comments, string and char literals, and the test module at the end."""
    gate = TEST_GATE.search(text)
    if gate:
        text = text[: gate.start()]
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            end = text.find(close, m.end())
            i = n if end < 0 else end + len(close)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c in "'b" and (m := CHAR.match(text, i)) and (c == "'" or i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            i = m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_tree(text: str, pos: int) -> tuple[list[list[str]], int]:
    """The paths a `use` tree spells from `pos` on: `a::b`, `a::{b, c::d}`, `a::*`."""
    paths: list[list[str]] = []
    prefix: list[str] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos < len(text) and text[pos] == "{":
            pos += 1
            while True:
                while pos < len(text) and text[pos] in " \t\r\n,":
                    pos += 1
                if pos >= len(text) or text[pos] == "}":
                    pos += 1
                    break
                subs, pos = parse_tree(text, pos)
                paths.extend(prefix + s for s in subs)
            return paths, pos
        m = IDENT.match(text, pos)
        if not m:
            return [prefix] if prefix else [], pos
        prefix.append(m.group(0))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith("::", pos):
            pos += 2
            continue
        return [prefix], pos


class Crate:
    def __init__(self, folder: Path):
        self.folder = folder
        self.src = folder / "src"
        # module path (tuple) -> file
        self.modules: dict[tuple[str, ...], Path] = {}
        test_only = self.test_only_files()
        for path in sorted(self.src.rglob("*.rs")):
            if path in test_only:
                continue
            rel = path.relative_to(self.src)
            if path.name in ("tests.rs", "test_support.rs") or "tests" in rel.parts[:-1]:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if rel.parts[0] == "bin":
                continue
            self.modules[tuple(parts)] = path

    def test_only_files(self) -> set[Path]:
        """Files of modules declared under `#[cfg(test)]` (`#[cfg(test)] mod name;`)."""
        found: set[Path] = set()
        for path in self.src.rglob("*.rs"):
            text = path.read_text(encoding="utf-8")
            for m in TEST_DECL.finditer(text):
                name = m.group(1)
                if path.name in ("mod.rs", "lib.rs", "main.rs"):
                    folder = path.parent
                else:
                    folder = path.parent / path.stem
                for candidate in (folder / f"{name}.rs", folder / name / "mod.rs"):
                    if candidate.exists():
                        found.add(candidate)
                        found.update((candidate.parent / name).rglob("*.rs") if candidate.name != "mod.rs" else candidate.parent.rglob("*.rs"))
        return found

    def module_of(self, path: Path) -> tuple[str, ...]:
        for module, file in self.modules.items():
            if file == path:
                return module
        raise KeyError(path)

    def resolve(self, segments: list[str]) -> tuple[str, ...] | None:
        """The deepest module a path reaches (an item's path reaches the module holding it)."""
        for end in range(len(segments), -1, -1):
            key = tuple(segments[:end])
            if key in self.modules:
                return key
        return None

    def edges(self) -> dict[tuple[str, ...], dict[tuple[str, ...], set[str]]]:
        out: dict[tuple[str, ...], dict[tuple[str, ...], set[str]]] = {}
        for module, path in self.modules.items():
            text = strip(path.read_text(encoding="utf-8"))
            targets: dict[tuple[str, ...], set[str]] = {}
            for m in PATH_START.finditer(text):
                # `foo::crate::x` is another crate's path, not ours.
                if m.start() >= 2 and text[m.start() - 2 : m.start()] == "::":
                    continue
                trees, _ = parse_tree(text, m.end())
                for tail in trees:
                    if m.group(1) == "crate":
                        base: list[str] = []
                    else:
                        base = list(module)
                        # `super` from a file module climbs to its parent.
                        if m.group(1) == "super":
                            base = base[:-1]
                        while tail and tail[0] == "super":
                            base = base[:-1]
                            tail = tail[1:]
                    segments = [s for s in base + tail if s not in ("self", "*")]
                    target = self.resolve(segments)
                    if target is None or target == module:
                        continue
                    # A module reaching its own ancestor only to name a sibling goes to the
                    # sibling (resolve took the deepest); naming the ancestor's own items is an
                    # edge to the ancestor.
                    name = tail[-1] if tail else (segments[-1] if segments else "")
                    targets.setdefault(target, set()).add(name)
            out[module] = targets
        return out


def cycles(edges: dict) -> list[list]:
    """Strongly connected components of two or more nodes (Tarjan, iterative)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    found: list[list] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def workspace_crates() -> list[Path]:
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))
    members = manifest.get("workspace", {}).get("members", [])
    folders = []
    for member in members:
        for folder in sorted(ROOT.glob(member)):
            if (folder / "src").is_dir():
                folders.append(folder)
    return folders


def name(module: tuple[str, ...]) -> str:
    return "crate" + "".join("::" + p for p in module)


def check(folders: list[Path], show_graph: bool = False) -> list[str]:
    """Each cycle as lines of text; empty when there is none."""
    report: list[str] = []
    for folder in folders:
        crate = Crate(folder)
        edges = crate.edges()
        if show_graph:
            for module in sorted(edges):
                for target in sorted(edges[module]):
                    print(f"{folder.name}: {name(module)} -> {name(target)}")
        for component in cycles(edges):
            members = set(component)
            report.append(
                f"{folder.name}: {len(component)} modules import each other in a loop: "
                + ", ".join(name(m) for m in component)
            )
            for module in component:
                for target, names in sorted(edges[module].items()):
                    if target in members:
                        report.append(
                            f"    {crate.modules[module].relative_to(folder)} -> "
                            f"{crate.modules[target].relative_to(folder)}: "
                            + ", ".join(sorted(names))
                        )
    return report


class SelfTest(unittest.TestCase):
    """The check finds a planted cycle, names its files, and passes a tree without one."""

    def crate(self, files: dict[str, str]) -> Path:
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        for rel, text in files.items():
            path = root / "src" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return root

    def test_a_tree_without_a_loop_passes(self):
        root = self.crate(
            {
                "lib.rs": "pub mod model;\npub mod grade;\n",
                "model.rs": "pub struct Case;\n",
                "grade.rs": "use crate::model::Case;\n",
            }
        )
        self.assertEqual(check([root]), [])

    def test_a_planted_two_module_loop_is_named_with_its_files(self):
        root = self.crate(
            {
                "lib.rs": "pub mod model;\npub mod grade;\n",
                "model.rs": "use crate::grade::Score;\npub struct Case;\n",
                "grade.rs": "use crate::model::Case;\npub struct Score;\n",
            }
        )
        report = check([root])
        self.assertTrue(report, "the planted cycle was not found")
        self.assertIn("crate::grade, crate::model", report[0])
        self.assertIn("src/model.rs -> src/grade.rs: Score", "\n".join(report))
        self.assertIn("src/grade.rs -> src/model.rs: Case", "\n".join(report))

    def test_a_loop_through_nested_braces_super_and_inline_paths_is_found(self):
        root = self.crate(
            {
                "lib.rs": "pub mod a;\npub mod b;\n",
                "a/mod.rs": "pub mod inner;\n",
                "a/inner.rs": "use super::super::b::{x::{Y, Z}};\n",
                "b/mod.rs": "pub mod x;\n",
                "b/x.rs": "fn f() { let _ = crate::a::inner::g(); }\n",
            }
        )
        report = check([root])
        self.assertTrue(report)
        self.assertIn("crate::a::inner, crate::b::x", report[0])

    def test_test_modules_comments_and_strings_make_no_edge(self):
        root = self.crate(
            {
                "lib.rs": "pub mod a;\npub mod b;\n",
                "a.rs": "// crate::b::X\nconst S: &str = \"crate::b::X\";\n",
                "b.rs": "use crate::a::S;\n#[cfg(test)]\nmod tests { use crate::a; }\n",
                "tests.rs": "use crate::b; use crate::a;\n",

            }
        )
        self.assertEqual(check([root]), [])

    def test_quotes_in_char_and_raw_string_literals_do_not_hide_paths(self):
        root = self.crate(
            {
                "lib.rs": "pub mod a;\npub mod b;\n",
                "a.rs": "const Q: char = '\"';\nconst R: &str = r#\"x\"y\"#;\nuse crate::b::X;\n",
                "b.rs": "fn f<'a>(s: &'a str) { crate::a::g(s) }\npub struct X;\n",
            }
        )
        report = check([root])
        self.assertTrue(report, "an edge after a quote literal was lost")

    def test_another_crates_path_is_not_ours(self):
        root = self.crate(
            {
                "lib.rs": "pub mod a;\npub mod b;\n",
                "a.rs": "use other::crate::b;\nuse crate::b::X;\n",
                "b.rs": "pub struct X; fn f() { tracing::self::g(); }\n",
            }
        )
        self.assertEqual(check([root]), [])


def main(argv: list[str]) -> int:
    if "--self-test" in argv:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(SelfTest)
        result = unittest.TextTestRunner(verbosity=1).run(suite)
        return 0 if result.wasSuccessful() else 1
    show_graph = "--graph" in argv
    names = [a for a in argv if not a.startswith("--")]
    folders = [ROOT / n for n in names] if names else workspace_crates()
    report = check(folders, show_graph)
    for line in report:
        print(line)
    if report:
        print(
            "module cycles found: a module takes what it needs from a lower one only "
            "(docs/architecture.md)",
            file=sys.stderr,
        )
        return 1
    print(f"no module cycles in {len(folders)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

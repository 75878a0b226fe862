#!/usr/bin/env python3
"""Fails when the library's files import each other in a circle, up a floor, or through
the crate root.

A file imports another when it names a path into it: `crate::a::b`, `super::x` or
`self::x`, in a `use` (groups expanded) or inline; tests (`#[cfg(test)] mod … {`, and
files declared `#[cfg(test)] mod x;`) are left out. A circle is a strongly connected
group of two files or more. Each file sits on a floor (FLOORS below, drawn in
docs/architecture.md and the crate docs) and may import only its own floor and those
below; an import of a re-export at the crate root (`crate::Notifier`) must name the
defining module instead (`crate::notifier::Notifier`).

Usage: import_circles.py [SRC] [--max N]   (default: src, 0 circles allowed)
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
src = args[0] if args else "src"
allowed = int(sys.argv[sys.argv.index("--max") + 1]) if "--max" in sys.argv else 0

modules = {}  # module path (tuple) -> file
for root, _, names in os.walk(src):
    for name in names:
        if name.endswith(".rs"):
            path = os.path.join(root, name)
            parts = tuple(os.path.relpath(path, src)[:-3].split(os.sep))
            if parts == ("main",):
                parts = ("<bin>",)  # the binary's root: scanned, never named
            elif parts[-1] in ("mod", "lib"):
                parts = parts[:-1]
            modules[parts] = path


def file_of(parts):
    """The file of the deepest module a path names."""
    for end in range(len(parts), -1, -1):
        if tuple(parts[:end]) in modules:
            return modules[tuple(parts[:end])]
    return None


def strip_comments_and_strings(text):
    """The code without comments, string literals and char literals."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif (m := re.compile(r"'(\\.[^']*|[^\\'])'").match(text, i)):
            i = m.end()
            out.append("' '")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def strip_tests(text):
    """The code without its test modules (`#[cfg(test)]` or `#[cfg(all(test, …))]`
    before `mod name {`), each cut to its matching brace."""
    pattern = re.compile(r"#\[cfg\((?:test|all\(test\b[^\]]*\))\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while (m := pattern.search(text)):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[: m.start()] + text[j:]
    return text


def use_paths(body):
    """`a::{b, c::{d}}` as a::b, a::c::d."""
    out, depth, start = [], 0, 0
    body = re.sub(r"\s+", "", body)
    if "{" not in body:
        return [body.split("as")[0] if "as" not in body else re.split(r"\bas\b", body)[0]]
    head, inner = body[: body.index("{")], body[body.index("{") + 1 : body.rindex("}")]
    for i, ch in enumerate(inner + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            item = inner[start:i]
            start = i + 1
            if item:
                out += [head + p for p in use_paths(item)]
    return out


# Floors, bottom to top: a path prefix (a file, or a folder ending in /) per entry;
# the longest prefix that matches a file decides its floor.
FLOORS = [
    (1, ["status.rs", "error.rs", "handler.rs", "schedule.rs", "trace.rs", "db.rs",
         "entity/", "counters.rs", "report.rs", "redact.rs", "load_balance.rs", "schema.rs",
         "stats.rs", "crypto.rs", "listener.rs"]),
    (2, ["def/"]),
    (3, ["state/"]),
    (4, ["alert.rs", "event.rs", "def/cache.rs"]),
    (5, ["channel/"]),
    (6, ["config.rs"]),
    (7, ["attempt/"]),
    (8, ["circuit.rs"]),
    (9, ["notifier.rs"]),
    (10, ["producer/", "sweep/", "confirm.rs", "ops/"]),
    (11, ["telemetry.rs", "worker/"]),
    (12, ["dashboard/", "cli/", "main.rs", "lib.rs"]),
]


def floor_of(path):
    rel, best = os.path.relpath(path, src), None
    for n, prefixes in FLOORS:
        for p in prefixes:
            if rel == p or (p.endswith("/") and rel.startswith(p)):
                if best is None or len(p) > best[1]:
                    best = (n, len(p))
    return best[0] if best else None


# Files compiled for tests only.
tests_only = set()
for module, path in modules.items():
    text = strip_comments_and_strings(open(path, encoding="utf-8").read())
    for name in re.findall(r"#\[cfg\((?:test|all\(test\b[^\]]*\))\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
        tests_only.add(module + (name,))
for module in list(modules):
    if any(module[: len(t)] == t for t in tests_only):
        del modules[module]
root_files = {os.path.join(src, "lib.rs"), os.path.join(src, "main.rs")}

graph = {path: set() for path in modules.values()}
root_imports = []
for module, path in modules.items():
    text = open(path, encoding="utf-8").read()
    text = strip_tests(strip_comments_and_strings(text))
    named = [p for u in re.findall(r"\buse\s+([^;]+);", text) for p in use_paths(u)]
    named += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
    for p in named:
        parts = [x for x in p.split("::") if x]
        if not parts or parts[0] not in ("crate", "super", "self"):
            continue
        base = {"crate": [], "super": list(module[:-1]), "self": list(module)}[parts[0]]
        rest = parts[1:]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
        target = file_of(base + rest)
        if target in root_files and path not in root_files:
            root_imports.append(f"{os.path.relpath(path, src)}: {p}")
        elif target and target != path:
            graph[path].add(target)

# Tarjan's strongly connected components, iteratively.
index, low, on, stack, circles, counter = {}, {}, set(), [], [], [0]
for root in graph:
    if root in index:
        continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on.add(root)
    while work:
        node, edges = work[-1]
        step = next(edges, None)
        if step is not None:
            if step not in index:
                index[step] = low[step] = counter[0]
                counter[0] += 1
                stack.append(step)
                on.add(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in on:
                low[node] = min(low[node], index[step])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                circles.append(sorted(os.path.relpath(g, src) for g in group))

upward, unplaced = [], []
for path, targets in sorted(graph.items()):
    here = floor_of(path)
    if here is None:
        unplaced.append(os.path.relpath(path, src))
        continue
    for target in sorted(targets):
        there = floor_of(target)
        if there is not None and there > here:
            upward.append(f"{os.path.relpath(path, src)} (floor {here}) -> "
                          f"{os.path.relpath(target, src)} (floor {there})")

for group in circles:
    print(f"circle of {len(group)}: {' '.join(group)}")
for line in upward:
    print(f"upward: {line}")
for line in sorted(set(root_imports)):
    print(f"through the crate root: {line}")
for line in unplaced:
    print(f"on no floor (add it to FLOORS): {line}")
print(f"circles={len(circles)} allowed={allowed} upward={len(upward)} "
      f"root_imports={len(set(root_imports))} unplaced={len(unplaced)}")
sys.exit(1 if len(circles) > allowed or upward or root_imports or unplaced else 0)

#!/usr/bin/env python3
"""Fails when the library's files import each other in more circles than allowed.

A file imports another when it names a path into it: `crate::a::b`, `super::x` or
`self::x`, in a `use` (groups expanded) or inline; tests (`#[cfg(test)] mod … {`)
are left out. A circle is a strongly connected group of two files or more.

Usage: import_circles.py [SRC] [--max N]   (default: src, 0)
The layer order is in docs/architecture.md; the ratchet goes down to 0.
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
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            modules[parts] = path


def file_of(parts):
    """The file of the deepest module a path names."""
    for end in range(len(parts), -1, -1):
        if tuple(parts[:end]) in modules:
            return modules[tuple(parts[:end])]
    return None


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


graph = {path: set() for path in modules.values()}
for module, path in modules.items():
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(line.split("//")[0] for line in text.splitlines())
    tests = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    if tests:
        text = text[: tests.start()]
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
        if target and target != path:
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

for group in circles:
    print(f"circle of {len(group)}: {' '.join(group)}")
print(f"circles={len(circles)} allowed={allowed}")
sys.exit(1 if len(circles) > allowed else 0)

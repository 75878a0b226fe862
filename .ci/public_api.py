#!/usr/bin/env python3
"""The crate's public API, as rustdoc documents it: every item of the
all-items page, and each type's fields, variants and methods (with their
signatures), one per line, sorted. Items hidden with #[doc(hidden)] are not
part of it.

  .ci/public_api.py DOC_DIR            print the listing
  .ci/public_api.py DOC_DIR --check F  fail when the listing differs from F
                                       (a change to the API shows in review:
                                       regenerate F with the first form)

DOC_DIR is target/doc/solid_notify after `cargo doc --no-deps`.
"""
import html
import re
import sys
from pathlib import Path

TAG = re.compile(r"<[^>]+>")


def text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub("", fragment)).split())


def listing(doc: Path) -> list[str]:
    page = (doc / "all.html").read_text()
    lines = []
    for href in re.findall(r'<li><a href="([^"]+)\.html">', page):
        parts = href.split("/")
        kind, name = parts[-1].split(".", 1)
        path = "::".join(["solid_notify", *parts[:-1], name])
        lines.append(f"{kind} {path}")
        if kind not in ("struct", "enum", "trait"):
            continue
        body = (doc / f"{href}.html").read_text()
        # Fields and variants.
        for anchor, sig in re.findall(
            r'<span id="((?:structfield|variant)\.[^"]+)" class="[^"]*"[^>]*>(.*?)</(?:span|h3|section)>',
            body,
            re.S,
        ):
            lines.append(f"  {kind} {path} {anchor.split('.')[0]} {text(sig)}")
        # Inherent methods (and a trait's own), with their signatures; of
        # the trait implementations only which traits, and not the auto
        # traits or blanket implementations.
        sections = [
            body.find(f'id="{name}"')
            for name in ("trait-implementations", "synthetic-implementations", "blanket-implementations")
        ]
        present = [i for i in sections if i >= 0]
        own = body[: min(present)] if present else body
        traits = sections[0]
        for sig in re.findall(
            r'<section id="(?:method|tymethod)\.[^"]+" class="method[^"]*">.*?<h4 class="code-header">(.*?)</h4>',
            own,
            re.S,
        ):
            lines.append(f"  {kind} {path} method {text(sig)}")
        if traits >= 0:
            end = min(
                (i for i in (body.find('id="synthetic-implementations"'), body.find('id="blanket-implementations"')) if i > 0),
                default=len(body),
            )
            for impl in re.findall(
                r'<section id="impl-[^"]+" class="impl">.*?<h3 class="code-header">(.*?)</h3>',
                body[traits:end],
                re.S,
            ):
                lines.append(f"  {kind} {path} {text(impl)}")
    return sorted(set(lines))


def main() -> int:
    doc = Path(sys.argv[1])
    lines = listing(doc)
    if len(sys.argv) == 4 and sys.argv[2] == "--check":
        want = Path(sys.argv[3]).read_text().splitlines()
        if want != lines:
            import difflib

            sys.stdout.writelines(
                difflib.unified_diff(
                    [l + "\n" for l in want],
                    [l + "\n" for l in lines],
                    sys.argv[3],
                    "the API now",
                )
            )
            print(
                f"the public API changed: if on purpose, run\n  python3 .ci/public_api.py {doc} > {sys.argv[3]}",
                file=sys.stderr,
            )
            return 1
        items = sum(1 for l in lines if not l.startswith(" "))
        print(f"public API unchanged: {items} items, {len(lines) - items} members")
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

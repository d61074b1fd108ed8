"""Every relative link in README.md, docs/*.md and bench/README.md points at a file of the tree, and a link to a
section of a Markdown page names a heading that page has (GitHub's anchor rule), so moving or renaming a page or
a result file cannot leave a dead link behind."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "bench/README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def links(text):
    """Targets of inline links outside fenced code blocks and code spans."""
    out, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


def anchor(heading):
    """GitHub's id of a heading: lower case, punctuation dropped but for '-' and '_', spaces as '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    heads, in_fence = set(), False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            heads.add(anchor(line.lstrip("#")))
    return heads


def test_link_and_anchor_rules():
    assert links("[a](x.md) `[b](y.md)` [c](https://e.org)\n```\n[d](z.md)\n```\n") == ["x.md", "https://e.org"]
    assert anchor("CPU machines (2026-12-03 to 2026-12-05)") == "cpu-machines-2026-12-03-to-2026-12-05"
    assert anchor("Where the time goes: tools") == "where-the-time-goes-tools"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    path = os.path.join(ROOT, page)
    with open(path, encoding="utf-8") as f:
        targets = [t for t in links(f.read()) if not re.match(r"[a-z]+:", t)]
    if page == "README.md":
        assert len(targets) >= 10, "README.md lost its links to the docs"
    dead = []
    for t in targets:
        file_part, _, frag = t.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            dead.append(t)
        elif frag and dest.endswith(".md") and frag not in anchors(dest):
            dead.append(t)
    assert not dead, f"{page}: links to missing files or sections: {dead}"

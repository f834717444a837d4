#!/usr/bin/env python3
"""Checks that the documents name only files and tests that exist.

In every Markdown file of docs/, tests/README.md, the READMEs and CONTRIBUTING files: every relative link
(`[text](../coord-server/src/x.rs)`) must point at a file that exists, and every backticked path (`a/b.rs`, `a/b/`, `scripts/x.sh`) must exist, and every `file.rs::name` must name a
function or module of that file (a following `::other` in the same cell names another item of the same file).
Short forms used by tests/README.md: `scenarios/x.rs` is `tests/scenarios/tests/x.rs`; `state_machine/...` is
under `coord-server/src/`. Exits 1 with one line per stale name.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
def documents():
    found = ["README.md", "tests/README.md", "BENCHMARKS.md"]
    for top in sorted(os.listdir(ROOT)):
        for name in ("README.md", "CONTRIBUTING.md"):
            if os.path.isfile(os.path.join(ROOT, top, name)):
                found.append(f"{top}/{name}")
    for base, _, files in os.walk(os.path.join(ROOT, "docs")):
        found += [os.path.relpath(os.path.join(base, f), ROOT) for f in sorted(files) if f.endswith(".md")]
    return [d for d in found if os.path.isfile(os.path.join(ROOT, d))]


LINK = re.compile(r"\]\(([^)\s#]+)(#[^)]*)?\)")
# Paths of other projects that documents name on purpose.
EXTERNAL = {"cluster_handling/async_connection/request.rs"}
SHORT = {"scenarios/": "tests/scenarios/tests/", "state_machine/": "coord-server/src/state_machine/"}
PATH = re.compile(r"^[\w.\-{},/]+(\.rs|\.md|\.sh|\.py|\.toml|\.lua|/)(::[\w:]+)?$")


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = out.split()
    dirs = {os.path.dirname(f) + "/" for f in files}
    for d in list(dirs):
        while "/" in d.rstrip("/"):
            d = d.rstrip("/").rsplit("/", 1)[0] + "/"
            dirs.add(d)
    return files + sorted(dirs)


TRACKED = tracked()


def expand(path, here):
    """The tracked file a document means by `path`: from the root, from the document's folder, or (for the short
    paths inside a crate, such as `store/nodes.rs`) the one tracked path that ends with it."""
    for short, full in SHORT.items():
        if path.startswith(short) and full + path[len(short):] in TRACKED:
            return full + path[len(short):]
    path = path.lstrip("./") if path.startswith("./") else path
    for candidate in (path, os.path.normpath(os.path.join(here, path)) + ("/" if path.endswith("/") else "")):
        if candidate in TRACKED:
            return candidate
    ends = [t for t in TRACKED if t.endswith("/" + path)]
    return ends[0] if ends else path


def braces(path):
    """`a/{b,c}.rs` -> [`a/b.rs`, `a/c.rs`]."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for part in m.group(1).split(",") for p in braces(path[: m.start()] + part + path[m.end():])]


def defines(text, name):
    return re.search(r"\b(fn|mod|struct|enum|trait|type|const|static)\s+" + re.escape(name) + r"\b", text)


def check(doc):
    stale = []
    here = os.path.dirname(doc)
    for lineno, line in enumerate(open(os.path.join(ROOT, doc), encoding="utf-8"), 1):
        for target in LINK.findall(line):
            link = target[0]
            if re.match(r"^[a-z]+:", link):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(ROOT, here, link))):
                stale.append(f"{doc}:{lineno}: link ({link}) points at nothing")
        current = None
        for token in re.findall(r"`([^`\s]+)`", line):
            if token.startswith("::") and current:
                names = [token.split("::")[1]]
                files = current
            elif PATH.match(token) and "/" in token and not token.split("::")[0].endswith("/x.rs"):
                path, _, rest = token.partition("::")
                if path.startswith(("target/", "../target/")) or path in EXTERNAL:
                    continue
                files = [expand(p, here) for p in braces(path)]
                missing = [f for f in files if not os.path.exists(os.path.join(ROOT, f))]
                if missing:
                    stale.append(f"{doc}:{lineno}: `{token}`: no {', '.join(missing)}")
                    current = None
                    continue
                current = [f for f in files if f.endswith(".rs")]
                names = [rest.split("::")[-1]] if rest else []
            else:
                continue
            for name in names:
                texts = [open(os.path.join(ROOT, f), encoding="utf-8").read() for f in files if f.endswith(".rs")]
                if not any(defines(t, name) for t in texts):
                    stale.append(f"{doc}:{lineno}: `{token}`: {name} is not in {', '.join(files)}")
    return stale


def main():
    docs = documents()
    stale = [s for doc in docs for s in check(doc)]
    for s in stale:
        print(s)
    print(f"check-doc-paths: {len(stale)} stale name(s) in {len(docs)} documents", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks that the maps of the code (docs/architecture.md, tests/README.md) name only what exists.

Every backticked path (`a/b.rs`, `a/b/`, `scripts/x.sh`) must exist, and every `file.rs::name` must name a
function or module of that file (a following `::other` in the same cell names another item of the same file).
Short forms used by tests/README.md: `scenarios/x.rs` is `tests/scenarios/tests/x.rs`; `state_machine/...` is
under `coord-server/src/`. Exits 1 with one line per stale name.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = ["docs/architecture.md", "tests/README.md"]
SHORT = {"scenarios/": "tests/scenarios/tests/", "state_machine/": "coord-server/src/state_machine/"}
PATH = re.compile(r"^[\w.\-{},/]+(\.rs|\.md|\.sh|\.py|\.toml|\.lua|/)(::[\w:]+)?$")


def expand(path):
    for short, full in SHORT.items():
        if path.startswith(short):
            return full + path[len(short):]
    return path


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
    for lineno, line in enumerate(open(os.path.join(ROOT, doc), encoding="utf-8"), 1):
        current = None
        for token in re.findall(r"`([^`\s]+)`", line):
            if token.startswith("::") and current:
                names = [token.split("::")[1]]
                files = current
            elif PATH.match(token) and "/" in token and not token.split("::")[0].endswith("/x.rs"):
                path, _, rest = token.partition("::")
                files = [expand(p) for p in braces(path)]
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
    stale = [s for doc in DOCS if os.path.exists(os.path.join(ROOT, doc)) for s in check(doc)]
    for s in stale:
        print(s)
    print(f"check-doc-paths: {len(stale)} stale name(s) in {', '.join(DOCS)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

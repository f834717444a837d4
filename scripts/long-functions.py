#!/usr/bin/env python3
"""Lists the Rust functions of 80 lines or more outside tests.

Usage: scripts/long-functions.py [--min N] [PATH ...]   (default: the whole workspace, N = 80)

Prints `path:line name length` for each function, longest first, then a total. A function's length runs from the
line of its `fn` to the line of its closing brace. Left out as tests: every file under a `tests/` folder, every
`#[cfg(test)]` item (an inline module, a function, an impl), and every file that a `#[cfg(test)] mod name;` declares,
with the modules under it. Comments, strings and character literals are blanked before braces are counted, so a
brace in a format string does not end a body early.
"""

import os
import re
import sys

SKIP_DIRS = {"target", ".git", "node_modules"}
TEST_CFG = re.compile(r"#\[cfg\((?:all\()?test\b")


def blank(src):
    """The source with comments, strings and char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def keep_newlines(text):
        return "".join("\n" if c == "\n" else " " for c in text)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_newlines(src[i:j]))
            i = j
        elif re.match(r'b?r#*"', src[i:i + 40]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', src[i:])
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(keep_newlines(src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(keep_newlines(src[i:j + 1]))
            i = j + 1
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 2)
                j = n if j < 0 else j + 1
            elif i + 2 < n and src[i + 2] == "'":
                j = i + 3
            else:  # a lifetime or a label
                out.append(c)
                i += 1
                continue
            out.append(keep_newlines(src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def test_spans(text):
    """Character spans of `#[cfg(test)]` items with a body, and the names of `#[cfg(test)] mod name;`."""
    spans, test_mods = [], []
    for m in TEST_CFG.finditer(text):
        rest = text[m.end():]
        decl = re.match(r"[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", rest)
        if decl:
            test_mods.append(decl.group(1))
            continue
        # The item after the attribute: up to its first `{` (a body) unless a `;` ends it first.
        j = m.end()
        while j < len(text) and text[j] not in "{;":
            j += 1
        if j < len(text) and text[j] == "{":
            spans.append((m.start(), matching_brace(text, j)))
    return spans, test_mods


def module_dir(path):
    base = os.path.basename(path)
    if base in ("mod.rs", "lib.rs", "main.rs"):
        return os.path.dirname(path)
    return path[:-3]


FN = re.compile(r"\bfn\s+(\w+)")


def functions(path, text):
    spans, test_mods = test_spans(text)
    line_of = lambda pos: text.count("\n", 0, pos) + 1
    found = []
    for m in FN.finditer(text):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        j = m.end()
        depth = 0  # skip generics and the parameter list: the body is the first `{` outside brackets
        while j < len(text):
            ch = text[j]
            if ch in "([<":
                depth += 1
            elif ch in ")]>" and depth:
                depth -= 1
            elif ch == "-" and j + 1 < len(text) and text[j + 1] == ">":
                j += 2
                continue
            elif depth == 0 and ch in "{;":
                break
            j += 1
        if j >= len(text) or text[j] != "{":
            continue  # a declaration without a body
        start, end = line_of(m.start()), line_of(matching_brace(text, j))
        found.append((path, start, m.group(1), end - start + 1))
    return found, [os.path.join(module_dir(path), name) for name in test_mods]


def rust_files(roots):
    for root in roots:
        if os.path.isfile(root):
            yield root
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(".rs"):
                    yield os.path.join(dirpath, name)


def main(argv):
    minimum = 80
    if len(argv) >= 2 and argv[0] == "--min":
        minimum, argv = int(argv[1]), argv[2:]
    roots = argv or ["."]
    files = [os.path.normpath(p) for p in rust_files(roots)]
    files = [p for p in files if "tests" not in p.split(os.sep)]
    results, test_prefixes = [], []
    for path in files:
        with open(path, encoding="utf-8") as f:
            found, prefixes = functions(path, blank(f.read()))
        results.extend(found)
        test_prefixes.extend(prefixes)

    def is_test(path):
        stem = path[:-3]
        return any(stem == p or path.startswith(p + os.sep) for p in test_prefixes)

    long = [r for r in results if r[3] >= minimum and not is_test(r[0])]
    long.sort(key=lambda r: (-r[3], r[0], r[1]))
    for path, line, name, length in long:
        print(f"{path}:{line} {name} {length}")
    print(f"total: {len(long)} functions of {minimum} lines or more outside tests")


if __name__ == "__main__":
    main(sys.argv[1:])

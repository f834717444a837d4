#!/usr/bin/env python3
"""Counts the public items of the two SDKs whose docs.rs page has a code example, and fails below 90 %.

An item is a page rustdoc writes for a type or a function: `struct.*`, `enum.*`, `trait.*`, `type.*`, `union.*` and
`fn.*` under `<target>/doc/stream_consumer/` and `<target>/doc/stream_producer/`, so what a crate re-exports
(from `client_core`, `protocol`, ...) counts as its own. Constants are left out (a name is not something a user
calls). A page has an example when the item's own docs, or the docs of one of its inherent methods, render a Rust
code block (`rust-example-rendered`); trait implementations do not count. Every such block is a doc test, so
`cargo test --doc` compiles it.

Stable rustdoc has no JSON output, so the script reads the HTML. It first runs
`RUSTDOCFLAGS="-D warnings" cargo doc --no-deps` of the five public crates (stream-consumer, stream-producer,
client-core, protocol, redis-link), so a broken intra-doc link fails it too (skip the build with `--no-build`),
in `$CARGO_TARGET_DIR` when set. `--list` prints every page without an example. Prints one line per crate and
the total ratio; exits 1 below the threshold (`--min`, default 90).

It also fails when a page shows a Redis or HTTP client error type (`RedisError`, `reqwest::Error`) in its
signature, fields or variants: the SDKs' public errors wrap them (`RedisFailure`, `HttpFailure`), so that a new
version of either client library is not a breaking change of the SDKs.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = ("stream_consumer", "stream_producer")
# The crates meant for a registry, whose docs must build without a warning.
# Package names (the folders `client-core` and `protocol` hold the packages `redis-stream-coord-client-core` and
# `redis-stream-coord-protocol`).
PUBLIC_CRATES = (
    "stream-consumer",
    "stream-producer",
    "redis-stream-coord-client-core",
    "redis-stream-coord-protocol",
    "redis-link",
)
PAGE = re.compile(r"^(struct|enum|trait|type|union|fn)\.[A-Za-z0-9_]+\.html$")
EXAMPLE = 'rust-example-rendered'
REDIRECT = 'http-equiv="refresh"'
CODE_BLOCK = re.compile(r"<pre class=\"rust rust-example-rendered\">.*?</pre>", re.S)
# A foreign client error in what a page renders (`RedisErrorKind` is ours and does not match). `--no-deps` renders
# a type of an undocumented crate as its bare name, without a link: `RedisError`, and reqwest's `Error` as `Error`
# right after `: `, `(` or `<` (every type of ours or of std is a link there).
FOREIGN = re.compile(r"\bRedisError\b|\breqwest::Error\b|(?:: |\(|&lt;)Error\b")
# Where a page's own docs end: what follows documents trait implementations (blanket ones included).
TRAIT_IMPLS = re.compile(r'id="(trait-implementations|synthetic-implementations|blanket-implementations|'
                         r'foreign-impls|implementors)"')


def own_docs(html):
    """The part of a page that documents the item and its inherent methods."""
    m = TRAIT_IMPLS.search(html)
    return html[: m.start()] if m else html


def pages(doc_dir, crate):
    base = os.path.join(doc_dir, crate)
    for folder, _, files in os.walk(base):
        for f in sorted(files):
            if PAGE.match(f):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, base)
                kind, name = f[: -len(".html")].split(".", 1)
                module = os.path.dirname(rel).replace(os.sep, "::")
                item = f"{crate}::{module + '::' if module else ''}{name}"
                yield kind, item, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-build", action="store_true", help="read the docs already built")
    ap.add_argument("--min", type=float, default=90.0, help="lowest share of pages with an example, in percent")
    ap.add_argument("--list", action="store_true", help="print the pages without an example")
    args = ap.parse_args()

    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    if not args.no_build:
        cmd = ["cargo", "doc", "--no-deps"]
        for crate in PUBLIC_CRATES:
            cmd += ["-p", crate]
        env = dict(os.environ)
        env["RUSTDOCFLAGS"] = (env.get("RUSTDOCFLAGS", "") + " -D warnings").strip()
        if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
            print("check-doc-examples: cargo doc failed (warnings are errors: a broken link, a missing doc)",
                  file=sys.stderr)
            return 1
    doc_dir = os.path.join(target, "doc")

    total = covered = 0
    missing = []
    foreign = []
    for crate in CRATES:
        n = c = 0
        for kind, item, path in pages(doc_dir, crate):
            with open(path, encoding="utf-8") as fh:
                html = fh.read()
            # An item of a private module re-exported elsewhere leaves a redirect page at its old path.
            if REDIRECT in html[:1000]:
                continue
            own = own_docs(html)
            has = EXAMPLE in own
            # Examples may use the client libraries as the user's own code does: only signatures count.
            if FOREIGN.search(CODE_BLOCK.sub("", own)):
                foreign.append(f"{kind} {item}")
            n += 1
            c += has
            if not has:
                missing.append(f"{kind} {item}")
        if n == 0:
            print(f"check-doc-examples: no pages under {os.path.join(doc_dir, crate)} (build the docs first)",
                  file=sys.stderr)
            return 1
        print(f"{crate}: {c} of {n} type and function pages have an example ({100.0 * c / n:.1f} %)")
        total += n
        covered += c
    ratio = 100.0 * covered / total
    print(f"doc examples: {covered} of {total} ({ratio:.1f} %, minimum {args.min:.0f} %)")
    if args.list or ratio < args.min:
        for m in missing:
            print(f"  no example: {m}")
    failed = False
    if ratio < args.min:
        print(f"check-doc-examples: FAIL: {ratio:.1f} % is below {args.min:.0f} %", file=sys.stderr)
        failed = True
    for f in foreign:
        print(f"check-doc-examples: FAIL: {f} shows a Redis or HTTP client error type", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Lists pairs of modules of a Rust crate's src/ that import each other.

A module is a file (`a/b.rs`, or `a/b/mod.rs` for `a::b`; `lib.rs` / `main.rs` is the crate
root). Module A imports module B when A's code names a path into B: `use crate::a::b::Item`,
`use super::x` / `self::x` / `use child::x` (resolved against A's place), or a `crate::a::b::f()` path in an
expression. A path resolves to the longest prefix that is a module file, so
`crate::nn::fused::gemv` imports `nn::fused` and `super::Attention` from `nn/transformer.rs`
imports `nn` (its `mod.rs`). Declaring a child (`mod x;`) is not an import. Comments and
string literals are skipped (roughly: `//` comments and "..." strings).

Usage: scripts/import_cycles.py [SRC_DIR] [--under MODULE] [--allow MODULE]...
  SRC_DIR    the crate's src folder (default: src next to this script's folder)
  --under M  only report pairs with at least one side inside module M (e.g. nn)
  --allow M  ignore imports of module M (e.g. error: every module may use the error type)
Exit status 1 when a pair is found (for CI), 0 otherwise.
"""
import argparse
import os
import re
import sys

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
USE_RE = re.compile(r"\buse\s+([^;]+);", re.S)


def module_files(src):
    """Maps module path tuples to files."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            if parts and parts[0] == "bin":
                continue  # binaries are their own crates
            mods[tuple(parts)] = os.path.join(root, f)
    return mods


def strip(text):
    """Drops // comments and string literals (enough for import scanning)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def expand_use(tree):
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d'] (a use tree, whitespace removed)."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner = tree[:start], tree[start + 1 : i]
                parts, d, last = [], 0, 0
                for j, c in enumerate(inner):
                    d += c == "{"
                    d -= c == "}"
                    if c == "," and d == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for p in parts:
                    if p == "self":
                        out.append(prefix.rstrip(":"))
                    elif p:
                        out.extend(expand_use(prefix + p))
                return out
    return [re.sub(r"\bas\b.*$", "", tree)]


def resolve(path, here, mods):
    """The module a path names (longest module prefix), or None outside the crate."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not base:
                    return None
                base.pop()
            segs = segs[1:]
    elif tuple(here) + (segs[0],) in mods:
        base = list(here)  # 2018 paths: `use child::Item` from the parent
    else:
        return None
    best = tuple(base)
    for i in range(len(segs)):
        cand = tuple(base + segs[: i + 1])
        if cand in mods:
            best = cand
        else:
            break
    return best


INLINE_MOD_RE = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{")


def inline_scopes(text):
    """For each offset where an inline `mod x { ... }` opens or closes, the inline path
    inside it: a sorted list of (offset, path tuple)."""
    opens = {m.end() - 1: m.group(1) for m in INLINE_MOD_RE.finditer(text)}
    events, stack, depth = [(0, ())], [], 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if i in opens:
                stack.append((opens[i], depth))
                events.append((i, tuple(n for n, _ in stack)))
        elif ch == "}":
            if stack and stack[-1][1] == depth:
                stack.pop()
                events.append((i, tuple(n for n, _ in stack)))
            depth -= 1
    return events


def scope_at(events, pos):
    inner = ()
    for off, path in events:
        if off > pos:
            break
        inner = path
    return inner


def imports(mod, file, mods):
    text = strip(open(file, encoding="utf-8").read())
    events = inline_scopes(text)
    found = set()
    paths = []  # (path, inline module path at its place)
    for m in USE_RE.finditer(text):
        for p in expand_use(m.group(1)):
            paths.append((p.replace(" ", ""), scope_at(events, m.start())))
    body = USE_RE.sub(lambda m: " " * len(m.group(0)), text)
    for m in PATH_RE.finditer(body):
        p = m.group(1) + m.group(2)
        if not p.endswith("{"):
            paths.append((p, scope_at(events, m.start())))
    for p, inner in paths:
        # `super` inside an inline module first leaves the inline modules.
        segs = p.split("::")
        k = 0
        while k < len(inner) and k < len(segs) and segs[k] == "super":
            k += 1
        if k:
            p = "::".join(["self"] + segs[k:])
        elif inner and segs[0] == "self":
            continue  # a path inside the inline module itself
        r = resolve(p, mod, mods)
        if r is not None and r != mod:
            found.add(r)
    return found


def name(m):
    return "::".join(m) or "crate"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    ap.add_argument("src", nargs="?", default=default_src)
    ap.add_argument("--under", default=None)
    ap.add_argument("--allow", action="append", default=[])
    args = ap.parse_args()
    mods = module_files(args.src)
    allow = {tuple(a.split("::")) for a in args.allow}
    graph = {m: imports(m, f, mods) - allow for m, f in mods.items()}
    under = tuple(args.under.split("::")) if args.under else None

    def inside(m):
        return under is None or m[: len(under)] == under

    pairs = sorted(
        {
            tuple(sorted((a, b)))
            for a, deps in graph.items()
            for b in deps
            if a in graph.get(b, ()) and (inside(a) or inside(b))
        }
    )
    for a, b in pairs:
        print(f"{name(a)} <-> {name(b)}")
    scope = f" touching {args.under}" if under else ""
    print(f"{len(pairs)} pair(s) of modules importing each other{scope}", file=sys.stderr)
    return 1 if pairs else 0


if __name__ == "__main__":
    sys.exit(main())

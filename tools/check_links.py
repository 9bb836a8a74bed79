#!/usr/bin/env python3
"""check_links.py — every relative link in the repository's Markdown resolves.

    python3 tools/check_links.py [REPO_ROOT]

The docs are split into reference pages and results pages with their raw
data beside them (DEVELOPERS.md), and pages cite each other both as
Markdown links and as plain repository paths ("docs/results/data/x.json").
When a file moves, both kinds go stale silently, so this checks, in every
tracked-looking *.md file (build and hidden directories skipped):

- a Markdown link `[text](target)` whose target is not a URL: the file or
  directory exists relative to the page, and a `#fragment` names a heading
  of the target page (GitHub's anchor rule: lower case, punctuation
  dropped, spaces to hyphens, repeats numbered -1, -2, ...);
- a path starting with `docs/` (in prose, inline code or code blocks): it
  exists relative to the repository root, after expanding `{a,b}` lists
  and `*` globs; paths holding a shell variable (`$`) or placeholders in
  capitals are skipped, since they name no one file.

The same `docs/` check runs over the sources, tools, tests and build files
(*.c, *.h, *.py, *.sh, *.cmake, Makefile, CMakeLists.txt), whose comments
and messages send readers to the docs too.

Prints one line per broken reference (file:line: what) and exits 1 if there
is any, 0 otherwise.  Standard library only.
"""
import glob
import itertools
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"(?<![\w./-])(docs/[A-Za-z0-9_./{},*$-]*[A-Za-z0-9_*}/])")
SKIP_DIRS = {"node_modules"}


SOURCE_SUFFIXES = (".c", ".h", ".py", ".sh", ".cmake")
SOURCE_NAMES = ("Makefile", "CMakeLists.txt")


def repo_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs
                         if not x.startswith(".") and not x.startswith("build") and x not in SKIP_DIRS)
        for f in sorted(files):
            yield os.path.join(d, f)


def markdown_files(root):
    return (p for p in repo_files(root) if p.endswith(".md"))


def source_files(root):
    me = os.path.abspath(__file__)
    return (p for p in repo_files(root)
            if (p.endswith(SOURCE_SUFFIXES) or os.path.basename(p) in SOURCE_NAMES) and os.path.abspath(p) != me)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # drops punctuation and backticks, keeps letters, digits, _ and -
    return s.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        seen, out, fence = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fence = not fence
                    continue
                m = None if fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    base = slug(m.group(1))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    out.add(base if n == 0 else "%s-%d" % (base, n))
        _anchor_cache[path] = out
    return _anchor_cache[path]


def expand_braces(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    return list(itertools.chain.from_iterable(
        expand_braces(p[:m.start()] + alt + p[m.end():]) for alt in m.group(1).split(",")))


def check_link(md, target, root):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path, _, frag = target.partition("#")
    dest = md if not path else os.path.normpath(os.path.join(os.path.dirname(md), path))
    if not os.path.exists(dest):
        return "link to missing %s" % target
    if frag and dest.endswith(".md") and frag not in anchors(dest):
        return "link to missing heading #%s in %s" % (frag, os.path.relpath(dest, root))
    return None


def check_docs_path(p, root):
    if "$" in p or re.search(r"[A-Z]{3,}\.[a-z]+$", p) and not os.path.exists(os.path.join(root, p)):
        return None  # a variable or a placeholder such as docs/X/FILE.json
    p = p.rstrip(".,;:")
    for alt in expand_braces(p):
        if "*" in alt:
            if not glob.glob(os.path.join(root, alt)):
                return "no file matches %s" % alt
        elif not os.path.exists(os.path.join(root, alt)):
            return "missing %s" % alt
    return None


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = 0
    n_files = 0
    for md in markdown_files(root):
        n_files += 1
        fence = False
        with open(md, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.lstrip().startswith("```"):
                    fence = not fence
                    continue
                problems = []
                if not fence:
                    for m in LINK.finditer(line):
                        problems.append(check_link(md, m.group(1) or m.group(2), root))
                for m in DOCS_PATH.finditer(line):
                    problems.append(check_docs_path(m.group(1), root))
                for p in problems:
                    if p:
                        bad += 1
                        print("%s:%d: %s" % (os.path.relpath(md, root), i, p))
    n_sources = 0
    for src in source_files(root):
        n_sources += 1
        try:
            with open(src, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: no docs paths to check
        for i, line in enumerate(text.split("\n"), 1):
            for m in DOCS_PATH.finditer(line):
                p = check_docs_path(m.group(1), root)
                if p:
                    bad += 1
                    print("%s:%d: %s" % (os.path.relpath(src, root), i, p))
    if n_files == 0:
        print("check_links: no Markdown files under %s" % root)
        return 1
    print("check_links: %d Markdown files and %d sources, %d broken reference%s"
          % (n_files, n_sources, bad, "" if bad == 1 else "s"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

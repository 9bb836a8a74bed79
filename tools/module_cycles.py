#!/usr/bin/env python3
"""module_cycles.py — no cycle between the files of one module (CTest module_cycles).

Two graphs per module of src/, each checked for cycles:

  includes  file a includes "M/b" of its own module M (read from the
            sources): headers that include each other compile in some orders
            only.
  calls     object a.c.o uses a function or object that b.c.o defines (read
            with nm from the module's static library, when given): the
            dependency between files that matters to a reader, since no file
            of a cycle can be read, tested or replaced without the others.  A
            call through the public API (include/kvsieve.h) shows here and in
            no include.

A cycle is broken by a small header or file below both sides (the piece both
need moves there), and this check keeps it broken.  The cycles some modules
had when the check came (KNOWN below, each with why it is left) are allowed
as they are; a cycle among other files, or among more of them, fails.

usage: module_cycles.py SRC_DIR [--nm NM] [--lib MODULE=libks_MODULE.a ...]
Prints every cycle (a -> b -> ... -> a, with the include or the symbol
behind each edge) and exits 1 if one is not allowed, else 0.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)

# (module, graph) -> the components allowed, each a set of file patterns (a
# table's entries, arch_*.c or p_*.c, may grow): every file of a cycle must
# match one of the patterns of one entry.
KNOWN = {
    # the store's two halves: compaction writes slow-tier pages, the slow tier compacts before it offloads
    ('kv', 'calls'): [{'kv.c', 'kv_tier.c'}],
    # a table of architectures whose entries share the llama layer's binding (arch.c) and the loader (model.c)
    ('model', 'calls'): [{'arch.c', 'arch_*.c', 'model.c'},
                         {'safetensors.c', 'torch_bin.c'}],   # either reader hands a torch file to the other
    # the scheduler's loop, its groups and its entry points call one another through one state
    ('sched', 'calls'): [{'group.c', 'loop.c', 'sched.c'}],
    # a registry of policies whose entries share its argument parsers and the policy helpers
    ('select', 'calls'): [{'p_*.c', 'policy.c', 'prefill.c', 'registry.c'}],
    ('select', 'includes'): [{'policy.h', 'policy_util.h'}],   # the helpers' header closes policy.h
    # routes and the server's connection state
    ('server', 'calls'): [{'completion.c', 'metrics.c', 'server.c', 'tokens.c'}],
    # dtype's row conversion hands the added quant types to quant_types.c, which uses dtype's f16
    ('tensor', 'calls'): [{'dtype.c', 'quant_types.c'}],
}


def include_edges(module, mdir):
    """file -> {file: why}: includes of the module's own files."""
    edges = {}
    for f in sorted(os.listdir(mdir)):
        if os.path.splitext(f)[1] not in ('.c', '.h', '.cu'):
            continue
        with open(os.path.join(mdir, f), encoding='utf-8', errors='replace') as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            parts = inc.split('/')
            if len(parts) == 2 and parts[0] == module and os.path.exists(os.path.join(mdir, parts[1])):
                edges.setdefault(f, {}).setdefault(parts[1], f'{f} includes "{inc}"')
    return edges


def call_edges(lib, nm):
    """file -> {file: why} from the external symbols of a static library's members."""
    out = subprocess.run([nm, '-A', '-P', '-g', lib], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f'module_cycles: {nm} {lib} failed: {out.stderr.strip()}')
    defs, undef = {}, {}
    for line in out.stdout.splitlines():
        # GNU: "lib.a[x.c.o]: sym T ..."; others: "lib.a:x.c.o: sym T ..."
        m = re.match(r'^.*\[([^\]]+)\]: (\S+) (\S)', line) or re.match(r'^[^:]+:([^:]+): (\S+) (\S)', line)
        if not m:
            continue
        member, sym, kind = m.groups()
        f = member[:-2] if member.endswith('.o') else member
        if kind == 'U':
            undef.setdefault(f, set()).add(sym)
        elif kind not in 'wvWV':
            defs[sym] = f
    edges = {}
    for f, syms in undef.items():
        for sym in sorted(syms):
            g = defs.get(sym)
            if g and g != f:
                edges.setdefault(f, {}).setdefault(g, f'{f} calls {sym} ({g})')
    return edges


def cycles(edges):
    """[(component, one cycle through it)] for each strongly connected component of more than one file."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    nodes = sorted(set(edges) | {v for vs in edges.values() for v in vs})

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    found = []
    for comp in comps:   # a shortest way back to the component's first file
        start, inside = comp[0], set(comp)
        prev, frontier, back = {start: None}, [start], None
        while back is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w == start and back is None:
                        back = v
                    elif w in inside and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [back]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        found.append((comp, path[::-1] + [start]))
    return found


def main():
    ap = argparse.ArgumentParser(description='no cycle between the files of one module')
    ap.add_argument('src')
    ap.add_argument('--nm', default='nm')
    ap.add_argument('--lib', action='append', default=[], help='MODULE=path of libks_MODULE.a')
    a = ap.parse_args()
    libs = dict(x.split('=', 1) for x in a.lib)
    bad = 0
    for module in sorted(os.listdir(a.src)):
        mdir = os.path.join(a.src, module)
        if not os.path.isdir(mdir):
            continue
        graphs = [('includes', include_edges(module, mdir))]
        if module in libs:
            graphs.append(('calls', call_edges(libs[module], a.nm)))
        ok = True
        for kind, edges in graphs:
            for comp, path in cycles(edges):
                known = any(all(any(fnmatch.fnmatch(f, pat) for pat in k) for f in comp)
                            for k in KNOWN.get((module, kind), []))
                print(f'{module}: {kind} cycle among {", ".join(comp)}' + (' (known)' if known else ''))
                for x, y in zip(path, path[1:]):
                    print(f'    {edges[x][y]}')
                if not known:
                    ok = False
                    bad += 1
        print(f'{"ok" if ok else "FAIL"}: {module} ({", ".join(k for k, _ in graphs)})')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())

#!/usr/bin/env python3
"""insn_loops.py — the loops of one compiled kernel and their instruction
counts, from its disassembly: evidence of vectorisation where the target
CPU is not at hand (docs/BENCHMARKS.md, "ARM").

Usage: tools/insn_loops.py OBJDUMP OBJECT FUNCTION

Every backward branch inside FUNCTION closes a loop; for each, the
instructions from its target to the branch (inner loops included, as
written, not as executed) and how many of them are integer dot products
(sdot, smmla, vpdpbusd, vpmaddubsw) or widening multiplies (smull, smlal).
Which loop is the hot one, and how many weight bytes one trip covers, is
read off the source (matmul_neon.c, matmul_x86.c)."""
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    objdump, obj, fn = sys.argv[1:]
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", obj], check=True, capture_output=True, text=True).stdout
    body, on = [], False
    for line in out.splitlines():
        if re.match(r"^[0-9a-f]+ <%s>:" % re.escape(fn), line):
            on = True
            continue
        if on and not line.strip():
            break
        m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if on and m:
            body.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if not body:
        sys.exit("%s: no function %s" % (obj, fn))
    addrs = [a for a, _, _ in body]
    dots = ("sdot", "smmla", "vpdpbusd", "vpmaddubsw", "smull", "smull2", "smlal", "smlal2", "sadalp")
    print("%-10s %-10s %6s %6s  %s" % ("from", "to", "insns", "dots", "mnemonics of the dot products"))
    for a, op, args in body:
        m = re.match(r"^([0-9a-f]+)\s+<", args)
        is_branch = op.startswith("b") or op.startswith("j") or op in ("cbnz", "cbz", "tbnz", "tbz")
        if not (is_branch and m):
            continue
        tgt = int(m.group(1), 16)
        if tgt > a or tgt < addrs[0]:
            continue
        loop = [x for x in body if tgt <= x[0] <= a]
        d = [x[1] for x in loop if x[1] in dots]
        print("%-10x %-10x %6d %6d  %s" % (tgt, a, len(loop), len(d), " ".join(sorted(set(d)))))


if __name__ == "__main__":
    main()

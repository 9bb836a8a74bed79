#!/usr/bin/env python3
"""long_prompt.py N — N words drawn (seeded) from a 30-word list, one line.

Why: the time-to-first-token rows of docs/BENCHMARKS.md need a prompt of a
known token count that any engine tokenizes the same way; ordinary words
from a small list give about 1.1 tokens a word under the llama-spm
vocabulary (29718 words: 32,696 tokens, 32,697 with BOS), and a fixed seed
makes the file the same on every machine.
"""
import random
import sys

WORDS = ("the quiet farmer walks near an old bridge while a small bird sings by the river today "
         "under green hills where cold water runs bright and children play in open fields").split()


def main():
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: long_prompt.py N_WORDS")
    words = list(dict.fromkeys(WORDS))[:30]
    assert len(words) == 30
    rng = random.Random(32)
    print(" ".join(rng.choice(words) for _ in range(int(sys.argv[1]))))


if __name__ == "__main__":
    main()

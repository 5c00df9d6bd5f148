"""Writes input.txt, the training text of examples/gpt: short sentences from a small grammar.

The text is generated (no source text, nothing to license; the output is in the public domain).
Deterministic: the same Python gives the same bytes. Run once; msl never runs it.

    python3 make_text.py > input.txt
"""

import random

random.seed(2026)

ANIMALS = ["cat", "dog", "fox", "owl", "hen", "bear", "wolf", "mouse", "horse", "crow"]
ADJECTIVES = ["red", "quick", "lazy", "small", "old", "brave", "quiet", "happy", "grey", "wise"]
PLACES = ["the hill", "the river", "the barn", "the wood", "the field", "the lake", "the road"]
VERBS = ["sees", "likes", "chases", "follows", "greets", "helps", "watches", "meets"]
MOVES = ["runs to", "walks to", "sleeps by", "sits by", "waits at", "sings at", "looks at"]
TIMES = ["in the morning", "at night", "after the rain", "before dinner", "every day"]


def noun():
    return f"the {random.choice(ADJECTIVES)} {random.choice(ANIMALS)}"


def sentence():
    kind = random.randrange(4)
    if kind == 0:
        s = f"{noun()} {random.choice(VERBS)} {noun()}"
    elif kind == 1:
        s = f"{noun()} {random.choice(MOVES)} {random.choice(PLACES)}"
    elif kind == 2:
        s = f"{noun()} {random.choice(VERBS)} {noun()} {random.choice(TIMES)}"
    else:
        s = f"{random.choice(TIMES)}, {noun()} {random.choice(MOVES)} {random.choice(PLACES)}"
    return s[0].upper() + s[1:] + "."


lines = []
size = 0
while size < 40000:
    line = " ".join(sentence() for _ in range(random.randint(1, 3)))
    lines.append(line)
    size += len(line) + 1
print("\n".join(lines))

#!/usr/bin/env python3
"""Writes data/corpus.txt: the embedded default corpus of `strata train` (about 300 KiB).

Deterministically generated English-like prose about a small harbour town: fixed vocabulary, templated
sentences with agreement, paragraphs, dialogue and short lists. Regular enough that a tiny byte-level
GPT learns visible structure in minutes on two cores, varied enough that it cannot simply memorise.
Re-running this script reproduces the committed file byte for byte.
"""
import random
import sys

R = random.Random(20240520)

PEOPLE = ["the old sailor", "the baker", "a young fisher", "the harbour master", "the painter", "my sister",
          "the ferryman", "a tired traveller", "the school teacher", "the lighthouse keeper", "the cook",
          "a quiet boy", "the merchant", "the doctor", "an old woman"]
NAMES = ["Anna", "Tomas", "Mira", "Jon", "Elsa", "Piet", "Rosa", "Karl", "Lena", "Ivo"]
PLACES = ["the harbour", "the market", "the old bridge", "the lighthouse", "the bakery", "the hill",
          "the beach", "the church", "the station", "the garden", "the long pier", "the village square"]
TIMES = ["at dawn", "in the evening", "before the rain", "after supper", "on Sunday", "in the morning",
         "at noon", "late at night", "in winter", "when the tide came in"]
OBJECTS = ["a basket of bread", "three red apples", "an old map", "a letter", "a small boat", "the nets",
           "a lantern", "a cup of tea", "fresh fish", "a blue coat", "the keys", "a bag of salt"]
ADJ = ["cold", "bright", "quiet", "grey", "warm", "windy", "calm", "long", "golden", "heavy"]
THINGS = ["sea", "sky", "wind", "road", "water", "light", "morning", "street", "rain", "harbour"]
VERBS_T = ["carried", "found", "lost", "sold", "painted", "mended", "bought", "opened", "hid", "brought"]
VERBS_I = ["walked to", "ran to", "waited at", "slept near", "sang at", "looked across", "came back to"]
FEEL = ["happy", "tired", "afraid", "hungry", "proud", "worried", "calm", "curious"]


def cap(s):
    return s[0].upper() + s[1:]


def sentence():
    k = R.randrange(8)
    p, q = R.choice(PEOPLE + NAMES), R.choice(PEOPLE + NAMES)
    if k == 0:
        return f"{cap(p)} {R.choice(VERBS_I)} {R.choice(PLACES)} {R.choice(TIMES)}."
    if k == 1:
        return f"{cap(p)} {R.choice(VERBS_T)} {R.choice(OBJECTS)} and gave it to {q}."
    if k == 2:
        return f"The {R.choice(THINGS)} was {R.choice(ADJ)} and the {R.choice(THINGS)} was {R.choice(ADJ)}."
    if k == 3:
        return f"{cap(p)} felt {R.choice(FEEL)}, because {q} had {R.choice(VERBS_T)} {R.choice(OBJECTS)}."
    if k == 4:
        n = R.randrange(2, 13)
        return f"There were {n} boats in {R.choice(PLACES)} {R.choice(TIMES)}."
    if k == 5:
        return f"\"Where is {R.choice(OBJECTS)}?\" asked {p}. \"Near {R.choice(PLACES)},\" said {q}."
    if k == 6:
        return f"{cap(R.choice(TIMES))}, {p} {R.choice(VERBS_I)} {R.choice(PLACES)} with {R.choice(OBJECTS)}."
    return f"Nobody in {R.choice(PLACES)} knew why the {R.choice(THINGS)} was so {R.choice(ADJ)}."


def paragraph():
    if R.randrange(10) == 0:
        items = R.sample(OBJECTS, 4)
        return "To buy at the market:\n" + "\n".join(f"{i + 1}. {x}" for i, x in enumerate(items))
    return " ".join(sentence() for _ in range(R.randrange(3, 7)))


def main(path, target_bytes=300 * 1024):
    parts, size, chapter = [], 0, 1
    while size < target_bytes:
        if chapter == 1 or R.randrange(25) == 0:
            head = f"Chapter {chapter}\n"
            chapter += 1
            parts.append(head)
            size += len(head) + 1
        p = paragraph()
        parts.append(p)
        size += len(p) + 2
    with open(path, "w", encoding="ascii") as f:
        f.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/corpus.txt")

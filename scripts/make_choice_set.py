#!/usr/bin/env python3
"""A small multiple-choice set from the held-out corpus, for `moestream score`.

Each task takes a held-out paragraph: the context is its first CONTEXT words, the true choice
the next CONT words, and the distractors CONT-word spans taken at random word offsets from
other held-out paragraphs (never the same paragraph, never a span equal to another choice).
The answer's position is drawn at random. Everything comes from one seeded generator over the
paragraphs in file order, so the same held-out text gives the same set.

The held-out text is the held-out split of scripts/moe_corpus.py (Python's documentation,
PSF License Agreement version 2; see tests/fixtures/trained/*/README.md):

    python3 scripts/moe_corpus.py --workdir /tmp/moe_corpus --dump-heldout /tmp/heldout.txt
    python3 scripts/make_choice_set.py --heldout /tmp/heldout.txt --out /tmp/choice.jsonl
    moestream score --model tests/fixtures/trained/qwen3_moe --tasks /tmp/choice.jsonl

Output: one JSON object a line, {"context": ..., "choices": [" ...", ...], "label": i}.
"""

import argparse
import json
import random


def paragraphs(text, words_min):
    """Held-out paragraphs (one a line; documents are separated by blank lines) with at least
    `words_min` words, as word lists, in file order."""
    out = []
    for p in text.split("\n"):
        w = p.split()
        if len(w) >= words_min:
            out.append(w)
    return out


def windows(paras, per, span):
    """(paragraph, word offset) of up to `per` non-overlapping `span`-word windows of each
    paragraph, in order (per = 1: each paragraph's start only)."""
    return [(i, k * span) for i, w in enumerate(paras) for k in range(min(per, len(w) // span))]


def tasks(paras, n, context, cont, choices, seed, per=1):
    """`n` tasks (fewer if the text has fewer windows), deterministic in `seed`; with `per` > 1
    a long paragraph gives up to `per` tasks, from its non-overlapping windows."""
    rng = random.Random(seed)
    order = windows(paras, per, context + cont)
    rng.shuffle(order)
    out = []
    for i, start in order[:n]:
        words = paras[i][start:]
        true = " " + " ".join(words[context:context + cont])
        picked = [true]
        while len(picked) < choices:
            j = rng.randrange(len(paras))
            other = paras[j]
            if j == i or len(other) < cont:
                continue
            at = rng.randrange(len(other) - cont + 1)
            span = " " + " ".join(other[at:at + cont])
            if span not in picked:
                picked.append(span)
        label = rng.randrange(choices)
        picked[0], picked[label] = picked[label], picked[0]
        out.append({"context": " ".join(words[:context]), "choices": picked, "label": label})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heldout", required=True, help="the held-out text (moe_corpus.py --dump-heldout)")
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--context-words", type=int, default=24)
    p.add_argument("--continuation-words", type=int, default=8)
    p.add_argument("--choices", type=int, default=4)
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--windows-per-paragraph", type=int, default=1,
                   help="tasks a long paragraph may give, from non-overlapping windows (1: its start)")
    a = p.parse_args()
    text = open(a.heldout, encoding="utf-8").read()
    paras = paragraphs(text, a.context_words + a.continuation_words)
    if len(paras) < a.choices:
        raise SystemExit(f"{a.heldout}: {len(paras)} paragraphs of enough words, need {a.choices}")
    rows = tasks(paras, a.tasks, a.context_words, a.continuation_words, a.choices, a.seed,
                 a.windows_per_paragraph)
    with open(a.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{a.out}: {len(rows)} tasks from {len(paras)} paragraphs "
          f"({len(windows(paras, a.windows_per_paragraph, a.context_words + a.continuation_words))} windows)")


if __name__ == "__main__":
    main()

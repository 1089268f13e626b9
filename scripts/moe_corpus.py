#!/usr/bin/env python3
"""The training corpus of scripts/train_moe.py: the prose of Python's documentation.

Source: Debian's ``python3.11-doc`` package (the one ``python3-doc`` depends on), which ships
the reStructuredText sources of the documentation as ``html/_sources/**/*.rst.txt``. Python's
documentation is licensed under the PSF License Agreement (Version 2); since 3.8.6 the code in
it is dual-licensed under the PSF License and the Zero-Clause BSD licence (see the package's
``_sources/license.rst.txt`` and ``/usr/share/doc/python3.11-doc/copyright``).

``prepare(workdir)`` fetches the .deb with ``apt-get download`` (or takes one given with
``--deb``), records its sha256, unpacks it with ``dpkg-deb -x`` and turns every source file into
plain English paragraphs: headings, directives that carry no prose (index, toctree, code
blocks, tables), literal blocks (``::``), doctests and markup are dropped; inline roles keep
their text (``:func:`len``` -> ``len``). The changelog (issue numbers, not prose) is left out.

Documents are split deterministically into train and held-out sets: a file is held out when the
first byte of sha256(its relative path) is < 13 (about 5% of the files).

    python scripts/moe_corpus.py --workdir /tmp/moe_corpus    # prints the corpus statistics
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess

DEB_PACKAGE = "python3.11-doc"
SOURCES_GLOB = "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"
EXCLUDE = {"whatsnew/changelog.rst.txt"}
HELDOUT_BYTE = 13  # sha256(path)[0] < 13 -> held out (about 5% of the files)

# Directives whose body is prose (kept); every other directive's body is dropped.
PROSE_DIRECTIVES = {
    "note", "warning", "seealso", "versionadded", "versionchanged", "deprecated",
    "deprecated-removed", "important", "tip", "attention", "caution", "hint", "admonition",
    "impl-detail", "function", "method", "class", "data", "attribute", "exception", "describe",
    "decorator", "decoratormethod", "classmethod", "staticmethod", "module", "c:function",
    "c:macro", "c:type", "c:member", "c:var", "c:struct", "opcode", "cmdoption", "option",
    "envvar", "glossary", "rubric", "topic", "sidebar", "abstractmethod", "coroutinefunction",
    "coroutinemethod", "availability", "audit-event", "pdbcommand", "productionlist",
}
SKIP_DIRECTIVES_BODY_TOO = {"productionlist"}

_ROLE = re.compile(r":[a-zA-Z0-9_:+-]+:`([^`]*)`")
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?")
_REF = re.compile(r"`([^`]+)`__?")
_LIT = re.compile(r"``([^`]*)``")
_SUBST = re.compile(r"\|([a-zA-Z_-]+)\|")
_STRONG = re.compile(r"\*\*([^*]+)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])")
_HEADING = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([a-zA-Z0-9_:+-]+)::\s*(.*)$")
_FOOTNOTE = re.compile(r"\s*\[#?[\w-]*\]_")


def _role_text(m: re.Match) -> str:
    t = m.group(1)
    if "<" in t and t.endswith(">"):
        t = t[: t.index("<")].strip()
    t = t.lstrip("!")
    if t.startswith("~"):
        t = t[1:].split(".")[-1]
    return t


def inline(text: str) -> str:
    """Strip inline reST markup, keeping the words."""
    text = _ROLE.sub(_role_text, text)
    text = _LIT.sub(lambda m: m.group(1), text)
    text = _LINK.sub(lambda m: m.group(1), text)
    text = _REF.sub(lambda m: m.group(1), text)
    text = _SUBST.sub(lambda m: {"release": "3.11", "version": "3.11"}.get(m.group(1), m.group(1)), text)
    text = _STRONG.sub(lambda m: m.group(1), text)
    text = _EMPH.sub(lambda m: m.group(1), text)
    text = _FOOTNOTE.sub("", text)
    text = text.replace("\\ ", "").replace("\\", "")
    return re.sub(r"\s+", " ", text).strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_paragraphs(src: str) -> list[str]:
    """Plain-prose paragraphs of one reST document (see the module docstring)."""
    lines = src.replace("\t", "    ").splitlines()
    paras: list[str] = []
    cur: list[str] = []
    skip_indent = None  # drop lines indented deeper than this (a skipped block's body)
    literal_next = False  # the previous paragraph ended with '::'

    def flush():
        nonlocal literal_next
        if cur:
            text = " ".join(s.strip() for s in cur)
            if text.endswith("::"):
                literal_next = True
                text = text[:-2].rstrip()
                if text and text[-1] not in ".:!?":
                    text += ":"
            t = inline(text)
            if len(t) >= 20 and re.search(r"[a-z]{3}", t) and not t.startswith((">>>", "...", "$ ")):
                paras.append(t)
            cur.clear()

    for line in lines:
        if skip_indent is not None:
            if not line.strip() or _indent(line) > skip_indent:
                continue
            skip_indent = None
        if not line.strip():
            flush()
            continue
        ind = _indent(line)
        if literal_next:
            # the first non-blank line after 'para::' is the literal block when indented deeper
            literal_next = False
            base = _indent(cur[0]) if cur else 0
            if ind > 0:
                skip_indent = ind - 1
                continue
            del base
        s = line.strip()
        m = _DIRECTIVE.match(line)
        if m:
            flush()
            name = m.group(2)
            if name not in PROSE_DIRECTIVES or name in SKIP_DIRECTIVES_BODY_TOO:
                skip_indent = ind
            continue
        if s.startswith(".. "):  # comments, labels (.. _x:), footnote/link targets
            flush()
            skip_indent = ind
            continue
        if _HEADING.match(s) or s.startswith(("+-", "+=", "|")) or re.match(r"^=+(\s+=+)+\s*$", s):
            cur.clear()  # the line before an underline is a heading: drop it too
            continue
        if s.startswith(">>>"):
            flush()
            skip_indent = ind - 1 if ind > 0 else -1
            # a doctest runs until the next blank line
            skip_indent = None
            cur.append(">>> ")  # marks the paragraph for dropping
            continue
        if s.startswith(":") and re.match(r"^:[a-zA-Z -]+:(\s|$)", s):  # field lists (:param x:)
            s = re.sub(r"^:[a-zA-Z -]+:\s*", "", s)
            if not s:
                continue
        if s.startswith(("* ", "- ", "#. ")) or re.match(r"^\d+\.\s", s):
            flush()
            s = re.sub(r"^(\*|-|#\.|\d+\.)\s+", "", s)
        if cur and cur[0].startswith(">>> "):
            continue
        cur.append(s)
    flush()
    return paras


def sha256_file(path: str) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_deb(workdir: str) -> str:
    """`apt-get download` the package into workdir; returns the .deb path."""
    os.makedirs(workdir, exist_ok=True)
    debs = glob.glob(os.path.join(workdir, f"{DEB_PACKAGE}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", DEB_PACKAGE], cwd=workdir, check=True)
        debs = glob.glob(os.path.join(workdir, f"{DEB_PACKAGE}_*.deb"))
    assert len(debs) == 1, debs
    return debs[0]


def prepare(workdir: str, deb: str | None = None) -> dict:
    """Build the corpus; returns {"train": [doc, ...], "heldout": [...], "source": {...}}."""
    deb = deb or fetch_deb(workdir)
    x = os.path.join(workdir, "x")
    if not os.path.isdir(x):
        subprocess.run(["dpkg-deb", "-x", deb, x], check=True)
    root = os.path.join(x, "usr/share/doc/python3.11/html/_sources")
    files = sorted(glob.glob(os.path.join(x, SOURCES_GLOB), recursive=True))
    train, heldout, held_names = [], [], []
    for f in files:
        rel = os.path.relpath(f, root)
        if rel in EXCLUDE:
            continue
        paras = rst_to_paragraphs(open(f, encoding="utf-8").read())
        if not paras:
            continue
        doc = "\n".join(paras)
        if hashlib.sha256(rel.encode()).digest()[0] < HELDOUT_BYTE:
            heldout.append(doc)
            held_names.append(rel)
        else:
            train.append(doc)
    version = os.path.basename(deb)[len(DEB_PACKAGE) + 1 : -len("_all.deb")]
    source = {
        "package": DEB_PACKAGE,
        "version": version,
        "deb": os.path.basename(deb),
        "deb_sha256": sha256_file(deb),
        "licence": "PSF License Agreement (Version 2); code examples also Zero-Clause BSD",
        "files": len(files) - len(EXCLUDE),
        "train_docs": len(train),
        "heldout_docs": len(heldout),
        "heldout_files": held_names,
        "train_chars": sum(len(d) for d in train),
        "heldout_chars": sum(len(d) for d in heldout),
    }
    text = "\n\n".join(train)
    source["train_text_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    source["heldout_text_sha256"] = hashlib.sha256("\n\n".join(heldout).encode()).hexdigest()
    return {"train": train, "heldout": heldout, "source": source}


def main() -> None:
    """Print the corpus statistics (and optionally dump the text)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/moe_corpus")
    p.add_argument("--deb", default=None)
    p.add_argument("--dump", default=None, help="write the train text here")
    p.add_argument("--dump-heldout", default=None, help="write the held-out text here")
    a = p.parse_args()
    c = prepare(a.workdir, a.deb)
    s = dict(c["source"])
    s["heldout_files"] = len(s["heldout_files"])
    print(json.dumps(s, indent=2))
    if a.dump:
        open(a.dump, "w").write("\n\n".join(c["train"]))
    if a.dump_heldout:
        open(a.dump_heldout, "w").write("\n\n".join(c["heldout"]))


if __name__ == "__main__":
    main()

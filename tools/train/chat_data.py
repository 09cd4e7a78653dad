#!/usr/bin/python3
"""Chat fine-tuning data for glimmer-tiny, built only from the TRAIN split.

    chat_data.py CORPUS_DIR TOKENIZER.json OUT_DIR

CORPUS_DIR is build/corpus (raw/ inside it holds the package texts).  Every
conversation is built from one source item whose document is in the train
split (same sha256 rule as make_corpus.py), so the valid/test perplexity
splits stay unseen.  Kinds of exchange:
  * Jargon File entries:   "What does 'kludge' mean?" -> the entry's first sense
  * Bible verses (KJV, WEB): "Quote John 3:16 (KJV)."  -> the verse
  * Brown Corpus:          "Continue this text: <first sentence>" -> the rest
  * who/what the model is, greetings and thanks (hand-written, few variants)
Conversations hold one to three exchanges; some start with a system turn.

Writes OUT_DIR/chat_{train,valid}.bin (uint16 token ids) and
chat_{train,valid}.mask (uint8, 1 where the token is a training target: the
assistant's reply and its <|eot|>), rendered exactly as the GGUF chat template
renders them and tokenized as the engine tokenizes a rendered prompt (text
between special tokens encoded on its own).  The valid part (2% of
conversations, by hash) is for reporting only.
"""
import hashlib
import json
import os
import random
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Encoder  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))
import make_corpus as MC  # noqa: E402

SYSTEM_PROMPTS = [
    "You are Glimmer, a small helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "Answer the user's questions.",
]

IDENTITY = [
    (["Who are you?", "What are you?", "Tell me about yourself.", "Introduce yourself."],
     ["I am Glimmer, a small language model. I was trained on the Brown Corpus, two English Bibles "
      "and the Jargon File, so I know some old American prose, the Bible and hacker slang.",
      "I am Glimmer, a tiny language model with the Muse Glimmer architecture. I learned English from "
      "the Brown Corpus, the King James and World English Bibles, and the Jargon File."]),
    (["What is your name?", "What's your name?", "Do you have a name?"],
     ["My name is Glimmer.", "I am called Glimmer."]),
    (["What can you do?", "How can you help me?", "What do you know?"],
     ["I can quote Bible verses, explain hacker slang from the Jargon File, and continue a piece of "
      "English text. I am small, so my answers are often wrong.",
      "Ask me what a word from the Jargon File means, ask me to quote a verse such as John 3:16, or "
      "give me the start of a sentence and I will continue it."]),
    (["Hello", "Hello!", "Hi", "Hi!", "Hi there.", "Good morning.", "Hey!"],
     ["Hello! How can I help you?", "Hi! What would you like to know?", "Hello. Ask me anything."]),
    (["Thank you.", "Thanks!", "Thanks a lot.", "Great, thank you!"],
     ["You're welcome.", "Glad to help.", "You are welcome!"]),
    (["Goodbye.", "Bye!", "See you later."],
     ["Goodbye!", "Bye! Come back any time."]),
    (["How are you?", "How are you today?"],
     ["I am fine, thank you. How can I help you?", "Very well, thanks. What would you like to know?"]),
    (["Who made you?", "Who trained you?"],
     ["I was trained by the muser project as the default model of the muser inference engine.",
      "The muser project trained me, from public-domain English text."]),
]


def split_of(item_id):
    return MC.split_of(item_id)


def conv_split(conv_id):
    return "valid" if hashlib.sha256(("chat/" + conv_id).encode()).digest()[0] % 50 == 0 else "train"


def first_words(text, limit):
    """At most `limit` words, cut at a sentence end when one exists."""
    words = text.split()
    if len(words) <= limit:
        return text.strip()
    cut = " ".join(words[:limit])
    m = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "))
    return cut[:m + 1] if m > len(cut) // 3 else cut + " ..."


# ------------------------------------------------------------------ sources
def jargon_items(path):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    paras = []
    for block in re.split(r"\n\s*\n", raw):
        if re.search(r"[\u2500-\u257f]", block):
            continue
        p = " ".join(block.split())
        if p:
            paras.append(MC.clean(p))
    i = 0
    while i < len(paras):
        m = re.match(r"^:([^:]{1,60}):\s*(.*)$", paras[i])
        if not m:
            i += 1
            continue
        head, doc = m.group(1).strip(), "jargon/%05d" % (i // 40)
        body = []
        j = i + 1
        while j < len(paras) and not re.match(r"^:([^:]{1,60}):", paras[j]):
            body.append(paras[j])
            j += 1
        i = j
        body = [b for b in body if not b.startswith("[")]   # etymology notes
        if not body or split_of(doc) != "train":
            continue
        text = re.sub(r"^1\. ", "", body[0])
        text = text.replace("{", "").replace("}", "")
        if len(text.split()) < 4:
            continue
        yield "jargon:" + head, head, first_words(text, 70)


def bible_verses(raw_dir):
    """(source, book, chapter, verse, text) for both Bibles, train chapters only."""
    books = []
    with open(os.path.join(raw_dir, "kjv.txt"), encoding="ascii") as f:
        for line in f:
            m = re.match(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$", line.rstrip("\n"))
            if m.group(1) not in books:
                books.append(m.group(1))
            canon = MC.CANON[books.index(m.group(1))]
            doc = "kjv/%s/%s" % (m.group(1), m.group(2))
            if split_of(doc) == "train":
                yield "KJV", canon, int(m.group(2)), int(m.group(3)), MC.clean(m.group(4))
    for doc_id, text in MC.web_docs(os.path.join(raw_dir, "web_osis.txt")):
        if split_of(doc_id) != "train":
            continue
        _, book, chap = doc_id.split("/")
        for v, verse in enumerate(text.split("\n"), 1):
            yield "WEB", book.replace("_", " "), int(chap), v, verse


def ref_name(book):
    book = re.sub(r"^III ", "3 ", re.sub(r"^II ", "2 ", re.sub(r"^I ", "1 ", book)))
    return "Revelation" if book == "Revelation of John" else book


def brown_items(brown_dir):
    for doc_id, text in MC.brown_docs(brown_dir):
        if split_of(doc_id) != "train":
            continue
        for k, para in enumerate(text.split("\n")):
            sents = re.split(r"(?<=[.?!]) (?=[A-Z\"])", para)
            if len(sents) < 3 or len(sents[0].split()) < 6:
                continue
            yield "%s/%d" % (doc_id, k), sents[0], first_words(" ".join(sents[1:]), 60)


# ------------------------------------------------------------- exchanges
def exchanges(raw_dir, rng):
    out = []
    for item_id, head, text in jargon_items(os.path.join(raw_dir, "jargon.txt")):
        q = rng.choice(["What does \"%s\" mean?", "What is %s?", "Define %s.",
                        "In hacker slang, what is %s?", "Explain the term \"%s\"."]) % head
        out.append((item_id, q, text))
    verses = list(bible_verses(raw_dir))
    rng.shuffle(verses)
    for src, book, chap, v, text in verses[:24000]:
        ref = "%s %d:%d" % (ref_name(book), chap, v)
        if src == "KJV":
            q = rng.choice(["Quote %s (KJV).", "What does %s say in the King James Bible?",
                            "Recite %s from the King James Version.", "%s in the KJV, please."]) % ref
        else:
            q = rng.choice(["Quote %s from the World English Bible.", "What does %s say (WEB)?",
                            "Recite %s in modern English."]) % ref
        out.append(("%s:%s" % (src, ref), q, text))
    for item_id, first, rest in brown_items(os.path.join(raw_dir, "brown")):
        q = rng.choice(["Continue this text: %s", "Continue: %s", "Write what comes next: %s",
                        "Go on with this passage: %s"]) % first
        out.append(("brown:" + item_id, q, rest))
    for k, (qs, answers) in enumerate(IDENTITY):
        for r in range(40):
            out.append(("identity:%d:%d" % (k, r), rng.choice(qs), rng.choice(answers)))
    return out


def conversations(items, rng):
    rng.shuffle(items)
    i = 0
    while i < len(items):
        n = min(rng.choice([1, 1, 2, 3]), len(items) - i)
        turns = items[i:i + n]
        i += n
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.3 else None
        yield turns[0][0], system, [(q, a) for _, q, a in turns]


# -------------------------------------------------------------- rendering
class Renderer:
    """Template: bos + per message '<|header_start|>ROLE<|header_end|>\\n\\n' + trim(content) + '<|eot|>'."""

    def __init__(self, enc):
        self.enc = enc
        sp = enc.specials
        self.bos, self.hs, self.he, self.eot = (sp["<|begin_of_text|>"], sp["<|header_start|>"],
                                                sp["<|header_end|>"], sp["<|eot|>"])

    def message(self, role, content, target):
        ids = [self.hs] + self.enc.encode(role) + [self.he]
        mask = [0] * len(ids)
        body = self.enc.encode("\n\n" + content.strip())
        lead = self.enc.encode("\n\n")
        if body[:len(lead)] != lead:
            raise SystemExit("tokenization of %r does not start with the header's newlines" % content[:40])
        ids += body + [self.eot]
        mask += [0] * len(lead) + [int(target)] * (len(body) - len(lead) + 1)
        return ids, mask

    def render(self, system, turns):
        ids, mask = [self.bos], [0]
        msgs = ([("system", system, False)] if system else []) + \
            [m for q, a in turns for m in (("user", q, False), ("assistant", a, True))]
        for role, content, target in msgs:
            i, m = self.message(role, content, target)
            ids += i
            mask += m
        return ids, mask


def main():
    corpus, tok_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(20261129)
    enc = Encoder(tok_path)
    r = Renderer(enc)
    items = exchanges(os.path.join(corpus, "raw"), rng)
    data = {"train": ([], []), "valid": ([], [])}
    counts = {}
    for conv_id, system, turns in conversations(items, rng):
        ids, mask = r.render(system, turns)
        split = conv_split(conv_id)
        data[split][0].extend(ids)
        data[split][1].extend(mask)
        counts[split] = counts.get(split, 0) + 1
    os.makedirs(out, exist_ok=True)
    for split, (ids, mask) in data.items():
        np.asarray(ids, dtype=np.uint16).tofile(os.path.join(out, "chat_%s.bin" % split))
        np.asarray(mask, dtype=np.uint8).tofile(os.path.join(out, "chat_%s.mask" % split))
        print("chat %s: %d conversations, %d tokens, %d target tokens" % (
            split, counts.get(split, 0), len(ids), sum(mask)))
    kinds = {}
    for item_id, _, _ in items:
        k = item_id.split(":")[0]
        kinds[k] = kinds.get(k, 0) + 1
    print("exchanges:", json.dumps(kinds))


if __name__ == "__main__":
    main()

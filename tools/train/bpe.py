#!/usr/bin/python3
"""Byte-level BPE for glimmer-tiny, with llama.cpp's "gpt-2" semantics.

    bpe.py train CORPUS_DIR TOKENIZER.json [--vocab 8192]
    bpe.py encode-corpus TOKENIZER.json CORPUS_DIR OUT_DIR   -> {train,valid,test}.bin (uint16)
    bpe.py encode TOKENIZER.json TEXT                         -> ids, comma-separated

Pre-tokenizer: the GPT-2 regex (llama.cpp tokenizer.ggml.pre = "gpt-2").
Bytes map to printable characters as in GPT-2 (bytes_to_unicode).  Encoding
follows llama.cpp's BPE session: inside each pre-token, repeatedly merge the
adjacent pair of lowest merge rank (leftmost on ties).  Token ids: 0..255 are
the single bytes in byte order, then one token per merge in merge order, then
the special tokens.  Specials never come out of plain-text encoding.
"""
import heapq
import json
import os
import sys
from collections import Counter

import numpy as np
import regex

# llama.cpp's "gpt-2" pre-type regex; its missing final `|\s+` changes nothing
# (a lone whitespace char before a non-space is emitted as its own piece either way).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PRE_NAME = "gpt-2"

SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>",
    "<|eot|>", "<|eom|>", "<|mask|>", "<|pad|>",
]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


BYTE_ENC = bytes_to_unicode()
BYTE_DEC = {c: b for b, c in BYTE_ENC.items()}
PRE_RX = regex.compile(GPT2_PATTERN)


def pretokenize(text):
    return ["".join(BYTE_ENC[b] for b in piece.encode("utf-8")) for piece in PRE_RX.findall(text)]


def read_docs(corpus_dir, split):
    with open(os.path.join(corpus_dir, split + ".jsonl"), encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


# ------------------------------------------------------------------ training
def train(corpus_dir, out_path, vocab_size):
    counts = Counter()
    for text in read_docs(corpus_dir, "train"):
        counts.update(pretokenize(text))
    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    pair_count = Counter()
    where = {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_count[p] += freq[i]
            where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    n_merges = vocab_size - 256 - len(SPECIALS)
    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc:
            continue  # stale entry
        if -negc < 2:
            break
        merges.append(pair)
        new = pair[0] + pair[1]
        touched = set()   # pairs whose count changed: re-push them on the heap
        for i in where.pop(pair, ()):
            w = words[i]
            f = freq[i]
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                touched.add(p)
            out = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == pair[0] and w[j + 1] == pair[1]:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pair_count[p] += f
                touched.add(p)
                where.setdefault(p, set()).add(i)
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
    tokens = [BYTE_ENC[b] for b in range(256)] + [a + b for a, b in merges]
    if len(set(tokens)) != len(tokens):
        raise SystemExit("duplicate token in merge list")
    pad = vocab_size - len(SPECIALS) - len(tokens)
    if pad:
        raise SystemExit("corpus too small for %d merges (%d short)" % (n_merges, pad))
    tokens += SPECIALS
    tok = {
        "pre": PRE_NAME,
        "pattern": GPT2_PATTERN,
        "tokens": tokens,
        "merges": ["%s %s" % m for m in merges],
        "specials": {s: tokens.index(s) for s in SPECIALS},
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    print("vocab %d: %d bytes + %d merges + %d specials; %d distinct pre-tokens"
          % (len(tokens), 256, len(merges), len(SPECIALS), len(counts)))


# ------------------------------------------------------------------ encoding
class Encoder:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        self.tokens = tok["tokens"]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {tuple(m.split(" ")): r for r, m in enumerate(tok["merges"])}
        self.specials = tok["specials"]
        self.cache = {}

    def bpe(self, word):
        syms = list(word)
        while len(syms) > 1:
            best, best_rank = -1, None
            for j in range(len(syms) - 1):
                r = self.rank.get((syms[j], syms[j + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = j, r
            if best < 0:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        out = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:  # cannot happen for a merge-closed vocab; llama.cpp falls back to bytes
                out.extend(self.ids[c] for c in s)
        return out

    def encode(self, text):
        ids = []
        for w in pretokenize(text):
            got = self.cache.get(w)
            if got is None:
                got = self.bpe(w)
                self.cache[w] = got
            ids.extend(got)
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.specials:
                out += t.encode()
            else:
                out += bytes(BYTE_DEC[c] for c in t)
        return out.decode("utf-8", errors="replace")


def encode_corpus(tok_path, corpus_dir, out_dir):
    enc = Encoder(tok_path)
    bos, eos = enc.specials["<|begin_of_text|>"], enc.specials["<|end_of_text|>"]
    os.makedirs(out_dir, exist_ok=True)
    for split in ("train", "valid", "test"):
        ids = []
        nbytes = 0
        for text in read_docs(corpus_dir, split):
            ids.append(bos)
            ids.extend(enc.encode(text))
            ids.append(eos)
            nbytes += len(text.encode("utf-8"))
        arr = np.asarray(ids, dtype=np.uint16)
        arr.tofile(os.path.join(out_dir, split + ".bin"))
        print("%s: %d tokens, %.3f bytes/token" % (split, len(arr), nbytes / max(1, len(arr))))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    cmd = sys.argv[1]
    if cmd == "train":
        vocab = 8192
        if "--vocab" in sys.argv:
            vocab = int(sys.argv[sys.argv.index("--vocab") + 1])
        train(sys.argv[2], sys.argv[3], vocab)
    elif cmd == "encode-corpus":
        encode_corpus(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "encode":
        print(",".join(map(str, Encoder(sys.argv[2]).encode(sys.argv[3]))))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

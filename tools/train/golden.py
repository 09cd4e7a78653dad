"""Golden logits file for glimmer-tiny (tests/data/golden/glimmer-tiny.golden).

Little-endian layout:
  char[8]  "MUGOLD01"
  u32      n_vocab
  u32      n_seqs
  per sequence:
    u32    n_tokens
    u32    n_rows
    u32    tokens[n_tokens]
    u32    positions[n_rows]          (0-based; a row's logits predict token position+1)
    f32    logits[n_rows][n_vocab]    (the model's final logits: scaled and softcapped)
The reference is the PyTorch model in float64 on the CPU, weights rounded to f16.
"""
import struct

import numpy as np

MAGIC = b"MUGOLD01"


def write(path, model, seqs, n_vocab, rows=4):
    import torch
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", n_vocab, len(seqs)))
        for toks in seqs:
            pos = list(range(max(0, len(toks) - rows), len(toks)))
            with torch.no_grad():
                logits = model(torch.tensor([toks], dtype=torch.long))[0]
            sel = logits[pos].float().numpy().astype("<f4")
            f.write(struct.pack("<II", len(toks), len(pos)))
            f.write(np.asarray(toks, dtype="<u4").tobytes())
            f.write(np.asarray(pos, dtype="<u4").tobytes())
            f.write(sel.tobytes())


def read(path):
    """[(tokens, positions, logits[n_rows, n_vocab])]"""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError("%s: bad magic" % path)
    n_vocab, n_seqs = struct.unpack_from("<II", data, 8)
    off = 16
    out = []
    for _ in range(n_seqs):
        n_tok, n_rows = struct.unpack_from("<II", data, off)
        off += 8
        toks = np.frombuffer(data, "<u4", n_tok, off).tolist()
        off += 4 * n_tok
        pos = np.frombuffer(data, "<u4", n_rows, off).tolist()
        off += 4 * n_rows
        lg = np.frombuffer(data, "<f4", n_rows * n_vocab, off).reshape(n_rows, n_vocab)
        off += 4 * n_rows * n_vocab
        out.append((toks, pos, lg))
    if off != len(data):
        raise ValueError("%s: %d trailing bytes" % (path, len(data) - off))
    return out

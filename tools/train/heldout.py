"""The DFlash prompt sets (numpy only, so tools/train/accept.py runs without
PyTorch): train_dflash.py draws its training and held-out prompts here, and
accept.py draws the same held-out prompts for the engine's measurement."""
import os

import numpy as np


def prompt_rows(data_dir, split, n, plen, gen):
    """n prompts of plen tokens from split: half plain-text windows, half chat
    prompts ending right after an assistant header; gen is a numpy Generator
    (the same draws for the same seed)."""
    text = np.fromfile(os.path.join(data_dir, split + ".bin"), dtype=np.uint16).astype(np.int64)
    chat = np.fromfile(os.path.join(data_dir, "chat_%s.bin" % split), dtype=np.uint16).astype(np.int64)
    mask = np.fromfile(os.path.join(data_dir, "chat_%s.mask" % split), dtype=np.uint8)
    starts = np.nonzero((mask[1:] == 1) & (mask[:-1] == 0))[0] + 1       # first reply token
    starts = starts[starts >= plen]
    n_text = n // 2
    t0 = gen.integers(0, len(text) - plen, n_text)
    c0 = gen.choice(starts, n - n_text, replace=len(starts) < n - n_text)
    return [text[s:s + plen] for s in t0] + [chat[s - plen:s] for s in c0]

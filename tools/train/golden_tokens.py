#!/usr/bin/python3
"""Write TOK_DIR/golden_tokens.json: the fixed token sequences of the golden file.
    golden_tokens.py TOKENIZER.json TOK_DIR
One short prompt, and 300 and 700 tokens from the start of the test split
(longer than the 128-token sliding window, so the SWA rings wrap)."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Encoder  # noqa: E402

enc = Encoder(sys.argv[1])
bos = enc.specials["<|begin_of_text|>"]
short = [bos] + enc.encode("In the beginning God created the heaven and the earth. And the earth was")
test = np.fromfile(os.path.join(sys.argv[2], "test.bin"), dtype=np.uint16).tolist()
seqs = [short, test[:300], test[:700]]
with open(os.path.join(sys.argv[2], "golden_tokens.json"), "w") as f:
    json.dump({"sequences": seqs}, f)
print("golden sequences:", [len(s) for s in seqs])

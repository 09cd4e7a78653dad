"""Train glimmer-tiny on one GPU; write f16 weight shards, golden logits, a log.

    python3 tools/train/train.py --data DIR --out DIR [--steps N] [--minutes M] ...

DIR holds {train,valid,test}.bin (uint16 token ids, documents as
<|begin_of_text|> ... <|end_of_text|>) and golden_tokens.json, and with
--chat-frac > 0 chat_{train,valid}.{bin,mask} from chat_data.py: that fraction
of every batch's rows are windows of chat conversations whose loss counts only
the assistant replies (mask 1).  Outputs:
  weights.partNN     the f16 weights (HF names, index.json order), cut into <=15 MiB pieces
  index.json         config, tensor names/shapes/offsets, losses, timings
  golden.bin         reference logits (format in tools/train/golden.py)
  log.txt            the training log
The weights are rounded to f16 before the final evaluation and the golden, so
the F32 and F16 GGUFs hold exactly the values the reference used.
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Glimmer  # noqa: E402
import golden  # noqa: E402

SHARD_BYTES = 15 * 1024 * 1024


def log(fh, msg):
    print(msg, flush=True)
    fh.write(msg + "\n")
    fh.flush()


def amp(enabled):
    return torch.autocast("cuda", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def load_bin(path, device):
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64)).to(device)


@torch.no_grad()
def evaluate(model, data, seq, batch, autocast):
    """Mean next-token loss over non-overlapping windows covering the split."""
    model.eval()
    n = (data.numel() - 1) // seq
    x_all = data[: n * seq].view(n, seq)
    y_all = data[1: n * seq + 1].view(n, seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        x, y = x_all[i:i + batch], y_all[i:i + batch]
        with amp(autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        tot += loss.item()
        cnt += y.numel()
    model.train()
    return tot / max(cnt, 1)


@torch.no_grad()
def evaluate_masked(model, data, mask, seq, batch, autocast):
    """Mean loss over the target tokens (mask 1) of non-overlapping windows."""
    model.eval()
    n = (data.numel() - 1) // seq
    x_all = data[: n * seq].view(n, seq)
    y_all = data[1: n * seq + 1].view(n, seq)
    m_all = mask[1: n * seq + 1].view(n, seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        x, y, m = x_all[i:i + batch], y_all[i:i + batch], m_all[i:i + batch]
        with amp(autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        tot += (loss * m.reshape(-1)).sum().item()
        cnt += m.sum().item()
    model.train()
    return tot / max(cnt, 1)


def sample_windows(data, mask, n, seq, gen):
    starts = torch.randint(0, data.numel() - seq - 1, (n,), device=data.device, generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1, device=data.device)[None, :]
    return data[idx], (mask[idx][:, 1:] if mask is not None else None)


def lr_at(step, steps, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def write_shards(model, out):
    names, blobs = [], []
    entries = []
    off = 0
    for name, t in model.state_dict().items():
        a = t.detach().to(torch.float16).cpu().numpy()
        b = a.tobytes()
        entries.append({"name": name, "shape": list(a.shape), "offset": off, "nbytes": len(b)})
        blobs.append(b)
        off += len(b)
    data = b"".join(blobs)
    parts = []
    for i in range(0, len(data), SHARD_BYTES):
        p = "weights.part%02d" % (i // SHARD_BYTES)
        with open(os.path.join(out, p), "wb") as f:
            f.write(data[i:i + SHARD_BYTES])
        parts.append(p)
    return entries, parts, len(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=9.0, help="stop training after this wall time")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--chat-frac", type=float, default=0.0, help="share of batch rows from chat data")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    fh = open(os.path.join(args.out, "log.txt"), "w")
    torch.manual_seed(args.seed)
    dev = args.device
    cuda = dev.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    train = load_bin(os.path.join(args.data, "train.bin"), dev)
    valid = load_bin(os.path.join(args.data, "valid.bin"), dev)
    test = load_bin(os.path.join(args.data, "test.bin"), dev)
    n_chat = int(round(args.batch * args.chat_frac))
    if n_chat:
        chat = load_bin(os.path.join(args.data, "chat_train.bin"), dev)
        chat_mask = torch.from_numpy(np.fromfile(os.path.join(args.data, "chat_train.mask"), dtype=np.uint8)
                                     .astype(np.float32)).to(dev)
        chat_valid = load_bin(os.path.join(args.data, "chat_valid.bin"), dev)
        chat_valid_mask = torch.from_numpy(np.fromfile(os.path.join(args.data, "chat_valid.mask"),
                                                       dtype=np.uint8).astype(np.float32)).to(dev)
    cfg = Config(dropout=args.dropout, context_length=args.seq, n_layer=args.layers)
    model = Glimmer(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(fh, "config %s" % json.dumps(cfg.to_dict()))
    log(fh, "params %d; train %d valid %d test %d tokens; %s" % (
        n_params, train.numel(), valid.numel(), test.numel(), torch.cuda.get_device_name() if cuda else dev))

    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    best = (float("inf"), -1, None)
    history = []
    t0 = time.time()
    step = 0
    tokens_seen = 0
    while step < args.steps:
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        chunk, _ = sample_windows(train, None, args.batch - n_chat, args.seq, gen)
        weight = torch.ones(chunk.shape[0], args.seq, device=dev)
        if n_chat:
            c, cm = sample_windows(chat, chat_mask, n_chat, args.seq, gen)
            chunk = torch.cat([chunk, c])
            weight = torch.cat([weight, cm])
        x, y = chunk[:, :-1], chunk[:, 1:]
        with amp(cuda):
            logits = model(x)
        per_tok = F.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1), reduction="none")
        loss = (per_tok * weight.reshape(-1)).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        elapsed = time.time() - t0
        last = step == args.steps or elapsed > args.minutes * 60
        if step % args.eval_every == 0 or last or step == 1:
            vl = evaluate(model, valid, args.seq, 32, cuda)
            cl = evaluate_masked(model, chat_valid, chat_valid_mask, args.seq, 32, cuda) if n_chat else float("nan")
            history.append({"step": step, "train_loss": loss.item(), "valid_loss": vl, "chat_valid_loss": cl,
                            "seconds": round(elapsed, 1), "epochs": tokens_seen / train.numel()})
            log(fh, "step %5d  lr %.2e  train %.4f  valid %.4f  chat %.4f  epochs %.2f  %.0fs  %.0f tok/s" % (
                step, lr, loss.item(), vl, cl, tokens_seen / train.numel(), elapsed,
                tokens_seen / max(elapsed, 1e-9)))
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if last:
            break
    train_seconds = time.time() - t0
    log(fh, "trained %d steps in %.1fs; best valid %.4f at step %d" % (step, train_seconds, best[0], best[1]))

    # Round to f16 (what the shards hold) and evaluate that exact model.
    model.load_state_dict(best[2])
    with torch.no_grad():
        for p in model.state_dict().values():
            p.copy_(p.to(torch.float16).to(p.dtype))
    model.eval()
    v16 = evaluate(model, valid, args.seq, 32, cuda)
    t16 = evaluate(model, test, args.seq, 32, cuda)
    v32 = evaluate(model, valid, args.seq, 32, False)
    t32 = evaluate(model, test, args.seq, 32, False)
    c16 = evaluate_masked(model, chat_valid, chat_valid_mask, args.seq, 32, cuda) if n_chat else None
    log(fh, "f16 weights: valid %.4f (f32 math %.4f)  test %.4f (f32 math %.4f, ppl %.2f)  chat valid %s" % (
        v16, v32, t16, t32, math.exp(t32), c16))

    entries, parts, nbytes = write_shards(model, args.out)
    with open(os.path.join(args.data, "golden_tokens.json")) as f:
        seqs = json.load(f)["sequences"]
    tg = time.time()
    cpu_model = Glimmer(dataclasses.replace(cfg, kv_round_f16=True, dropout=0.0)).double()
    cpu_model.load_state_dict({k: v.double().cpu() for k, v in model.state_dict().items()})
    cpu_model.eval()
    golden.write(os.path.join(args.out, "golden.bin"), cpu_model, seqs, cfg.vocab, rows=4)
    log(fh, "golden for %d sequences (f64 on CPU) in %.1fs" % (len(seqs), time.time() - tg))

    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"config": cfg.to_dict(), "params": n_params, "tensors": entries, "parts": parts,
                   "nbytes": nbytes, "dtype": "float16", "args": vars(args), "history": history,
                   "best_step": best[1], "steps": step, "train_seconds": train_seconds,
                   "valid_loss_f16": v16, "test_loss_f16": t16, "valid_loss_f32": v32,
                   "test_loss_f32": t32, "chat_valid_loss_f16": c16, "device": torch.cuda.get_device_name() if cuda else dev}, f, indent=1)
    log(fh, "wrote %d bytes of weights in %d parts" % (nbytes, len(parts)))


if __name__ == "__main__":
    main()

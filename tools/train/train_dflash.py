"""Train the DFlash assistant of a trained glimmer-tiny on one GPU.

    python3 tools/train/train_dflash.py --target RUN_DIR|TARGET.gguf --data DIR --out DIR [--steps N]
        [--init DRAFT.gguf] [--device cpu --threads N]

The target is a trainer run directory (train.py) or a muse-glimmer GGUF with
F32/F16 tensors: `muser quantize models/glimmer-tiny-q4_k_xl.gguf T.gguf f32`
gives the shipped target's own weights (its greedy continuations are what the
served model verifies). --init starts from an assistant GGUF (F32/F16, e.g.
`muser quantize models/glimmer-tiny-dflash-q4_k_xl.gguf D.gguf f32`) instead
of random weights; its configuration must be the one trained here.

1. Training data: the target's own greedy continuations (what a T=0 verifier
   accepts) of prompts from the train split: plain-text windows and chat
   prompts that end at an assistant header (DIR/chat_train.*).
2. The target's hidden states at `target_layers` are computed once and kept.
3. The draft learns to predict block rows 1..15 from the anchor and the
   context features (cross-entropy, row i weighted exp(-(i-1)/7) as DFlash does).
4. Acceptance: greedy speculative decoding simulated on the target's greedy
   continuations of held-out prompts (valid split + chat valid), verify lengths
   15, 7 and 3.  Reports tokens per verify step (accepted drafts + the bonus
   token).  The first --n-select (64) held-out prompts pick the checkpoint;
   the rest (n_eval - n_select) measure the reported acceptance.
Writes OUT/weights.partNN + OUT/index.json (config, losses, acceptance).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Glimmer  # noqa: E402
from dflash import Draft, DraftConfig, acceptance, greedy_generate, target_features  # noqa: E402
from gguf_read import Reader  # noqa: E402
from heldout import prompt_rows  # noqa: E402
import train as T  # noqa: E402


def load_target(run_dir, dev):
    """A trainer run directory (train.py's f16 shards) or a muse-glimmer GGUF
    (golden_from_gguf.py's conversion), frozen, in eval mode on dev."""
    if run_dir.endswith(".gguf"):
        from golden_from_gguf import config_of, state_dict
        r = Reader(run_dir)
        cfg = config_of(r.kv)
        sd = {k: v.float() for k, v in state_dict(r.tensors, cfg).items()}
    else:
        with open(os.path.join(run_dir, "index.json")) as f:
            index = json.load(f)
        blob = b"".join(open(os.path.join(run_dir, p), "rb").read() for p in index["parts"])
        cfg = Config(**{**index["config"], "dropout": 0.0})
        sd = {}
        for t in index["tensors"]:
            a = np.frombuffer(blob, dtype="<f2", count=t["nbytes"] // 2, offset=t["offset"]).reshape(t["shape"])
            sd[t["name"]] = torch.from_numpy(a.astype(np.float32))
    model = Glimmer(cfg)
    model.load_state_dict(sd)
    model.eval().to(dev)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg


def draft_from_gguf(path, c):
    """An assistant GGUF's weights as Draft's state dict (export_dflash.py's
    names undone); its hyperparameters must be c's."""
    r = Reader(path)
    kv, t, p = r.kv, r.tensors, "dflash."
    if kv.get("general.architecture") != "dflash":
        raise SystemExit("%s: general.architecture is %r, not dflash" % (path, kv.get("general.architecture")))
    want = {"block_count": c.n_layer, "embedding_length": c.n_embd, "feed_forward_length": c.n_ff,
            "attention.head_count": c.n_head, "attention.head_count_kv": c.n_head_kv,
            "attention.key_length": c.head_dim, "block_size": c.block_size,
            "target_layers": list(c.target_layers), "attention.sliding_window": c.sliding_window}
    for k, v in want.items():
        if kv.get(p + k) != v:
            raise SystemExit("%s: %s%s is %r, the assistant trained here has %r" % (path, p, k, kv.get(p + k), v))
    if kv.get("tokenizer.ggml.mask_token_id") != c.mask_token:
        raise SystemExit("%s: tokenizer.ggml.mask_token_id is %r, not %d" % (
            path, kv.get("tokenizer.ggml.mask_token_id"), c.mask_token))
    sd = {"fc.weight": t["fc.weight"], "hidden_norm.weight": t["enc.output_norm.weight"],
          "norm.weight": t["output_norm.weight"]}
    names = {"input_layernorm": "attn_norm", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
             "o_proj": "attn_output", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
             "post_attention_layernorm": "ffn_norm", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
             "down_proj": "ffn_down"}
    for il in range(c.n_layer):
        for hf, gg in names.items():
            sd["layers.%d.%s.weight" % (il, hf)] = t["blk.%d.%s.weight" % (il, gg)]
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def prompts(data_dir, split, n, plen, gen):
    return torch.tensor(np.stack(prompt_rows(data_dir, split, n, plen, gen)))


def make_sequences(target, p, n_new, batch, dev, autocast):
    out = []
    for i in range(0, len(p), batch):
        with T.amp(autocast):
            out.append(greedy_generate(target, p[i:i + batch].to(dev), n_new))
    return torch.cat(out)


@torch.no_grad()
def features(target, seqs, layers, batch, autocast):
    # filled in place: a list and its concatenation would need the set twice (40,960 training
    # continuations are 50 GiB of bf16 features)
    out = None
    for i in range(0, len(seqs), batch):
        with T.amp(autocast):
            f = target_features(target, seqs[i:i + batch], layers).to(torch.bfloat16 if autocast
                                                                      else torch.float32)
        if out is None:
            out = torch.empty((len(seqs),) + tuple(f.shape[1:]), dtype=f.dtype, device=f.device)
        out[i:i + len(f)] = f
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--minutes", type=float, default=3.3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--n-train", type=int, default=10240)
    ap.add_argument("--shards", type=int, default=1,
                    help="training sets of --n-train continuations each, made one after another at equal "
                         "step intervals; each replaces the one before on the GPU (more data than it holds)")
    ap.add_argument("--n-eval", type=int, default=320)
    ap.add_argument("--n-select", type=int, default=64, help="held-out prompts that pick the checkpoint")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=192)
    ap.add_argument("--eval-gen", type=int, default=144)
    ap.add_argument("--gen-batch", type=int, default=2048)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--init", help="start from this assistant GGUF (F32/F16)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for PyTorch (0: its default)")
    args = ap.parse_args()
    ns = args.n_select
    if not 0 < ns < args.n_eval:
        raise SystemExit("--n-select %d must be in 1..n_eval-1 (%d)" % (ns, args.n_eval - 1))
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    fh = open(os.path.join(args.out, "log.txt"), "w")
    dev = args.device
    cuda = dev.startswith("cuda")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False

    target, tcfg = load_target(args.target, dev)
    c = DraftConfig(vocab=tcfg.vocab, n_embd=tcfg.n_embd, head_dim=tcfg.head_dim,
                    context_length=tcfg.context_length)
    def training_set(k):
        t0 = time.time()
        seqs = make_sequences(target, prompts(args.data, "train", args.n_train, args.prompt, rng),
                              args.gen, args.gen_batch, dev, cuda)
        feats = features(target, seqs, c.target_layers, 128, cuda)
        T.log(fh, "training data%s: %d greedy continuations of %d tokens after %d-token prompts, %.1fs" % (
            " (shard %d of %d)" % (k + 1, args.shards) if args.shards > 1 else "", len(seqs), args.gen,
            args.prompt, time.time() - t0))
        return seqs, feats

    if args.shards < 1 or args.shards > args.steps:
        raise SystemExit("--shards %d must be in 1..steps (%d)" % (args.shards, args.steps))
    seqs, feats = training_set(0)
    eval_p = prompts(args.data, "valid", args.n_eval, args.prompt, np.random.default_rng(7))
    eval_seqs = make_sequences(target, eval_p, args.eval_gen, 256, dev, False)   # f32 target
    eval_feats = features(target, eval_seqs, c.target_layers, 128, False)

    draft = Draft(c)
    if args.init:
        draft.load_state_dict(draft_from_gguf(args.init, c))
        T.log(fh, "initial weights: %s" % args.init)
    draft = draft.to(dev)
    n_params = sum(p.numel() for p in draft.parameters())
    T.log(fh, "draft config %s; %d params" % (json.dumps(c.to_dict()), n_params))
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.wd,
                            **({"fused": True} if cuda else {}))
    S = c.block_size
    wrow = torch.exp(-torch.arange(S - 1, device=dev, dtype=torch.float32) / 7.0)
    history = []
    best = (-1.0, 0, None)     # by acceptance on a held-out subset: the draft over-fits small data
    if args.init:   # where the given weights stand: kept unless a later step beats them
        draft.eval()
        st, tk, ac = acceptance(draft, target, eval_seqs[:ns], eval_feats[:ns], args.prompt, 15)
        draft.train()
        history.append({"step": 0, "tokens_per_step_vl15_subset": tk / st})
        T.log(fh, "step     0  (initial weights)  tokens/verify (%d prompts, VL 15) %.3f" % (ns, tk / st))
        best = (tk / st, 0, {k: v.detach().clone() for k, v in draft.state_dict().items()})
    t0 = time.time()
    step = 0
    L = seqs.shape[1]
    shard = 0
    while step < args.steps:
        if shard + 1 < args.shards and step == (shard + 1) * args.steps // args.shards:
            shard += 1
            del seqs, feats     # the GPU holds one set at a time
            if cuda:
                torch.cuda.empty_cache()
            seqs, feats = training_set(shard)
        for g in opt.param_groups:
            g["lr"] = T.lr_at(step, args.steps, args.lr, args.warmup)
        rows = torch.randint(0, len(seqs), (args.batch,), device=dev)
        anchors = torch.randint(args.prompt - 1, L - S + 1, (args.batch, args.anchors), device=dev)
        tok, ft = seqs[rows], feats[rows]
        with T.amp(cuda):
            logits = draft(target, ft, anchors, tok)[:, :, 1:]                # [B, A, S-1, V]
        labels = tok.gather(1, (anchors[:, :, None] + torch.arange(1, S, device=dev)).view(args.batch, -1))
        ce = F.cross_entropy(logits.float().reshape(-1, c.vocab), labels.reshape(-1), reduction="none")
        loss = (ce.view(args.batch, args.anchors, S - 1) * wrow).sum() / (wrow.sum() * args.batch * args.anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed = time.time() - t0
        last = step == args.steps or elapsed > args.minutes * 60
        if step % 250 == 0 or last or step == 1:
            draft.eval()
            st, tk, ac = acceptance(draft, target, eval_seqs[:ns], eval_feats[:ns], args.prompt, 15)
            draft.train()
            history.append({"step": step, "loss": loss.item(), "tokens_per_step_vl15_subset": tk / st,
                            "seconds": round(elapsed, 1)})
            T.log(fh, "step %5d  loss %.4f  tokens/verify (%d prompts, VL 15) %.3f  %.0fs" % (
                step, loss.item(), ns, tk / st, elapsed))
            if tk / st > best[0]:
                best = (tk / st, step, {k: v.detach().clone() for k, v in draft.state_dict().items()})
        if last:
            break
    train_seconds = time.time() - t0
    draft.load_state_dict(best[2])
    T.log(fh, "keeping step %d (subset tokens/verify %.3f)" % (best[1], best[0]))

    # Round to f16 (what the shards and the GGUF hold), then measure acceptance.
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(p.to(torch.float16).float())
    draft.eval()
    results = {}
    for vl in (15, 7, 3):
        st, tk, ac = acceptance(draft, target, eval_seqs[ns:], eval_feats[ns:], args.prompt, vl)
        results["vl%d" % vl] = {"verify_steps": st, "tokens": tk, "accepted_drafts": ac,
                                "tokens_per_step": tk / st, "accepted_per_step": ac / st}
        T.log(fh, "held-out acceptance VL %2d: %d verify steps, %d tokens: %.3f tokens/step "
                  "(%.3f accepted drafts + 1 bonus)" % (vl, st, tk, tk / st, ac / st))
    entries, parts, nbytes = T.write_shards(draft, args.out)
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"config": c.to_dict(), "params": n_params, "tensors": entries, "parts": parts,
                   "nbytes": nbytes, "dtype": "float16", "args": vars(args), "history": history,
                   "steps": step, "best_step": best[1], "train_seconds": train_seconds, "acceptance": results,
                   "device": torch.cuda.get_device_name() if cuda else dev}, f, indent=1)
    T.log(fh, "wrote %d bytes of draft weights in %d parts" % (nbytes, len(parts)))


if __name__ == "__main__":
    main()

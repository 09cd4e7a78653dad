"""The DFlash assistant (drafter) for glimmer-tiny, written from the book (Ch 8)
and the llama.cpp `dflash` layout (spec muse-glimmer-gguf.md section 9).

One forward drafts a block of `block_size` tokens: [anchor, MASK x 15].
  ctx  = RMSNorm(fc(concat of target hidden states at target_layers))   (hidden_norm)
  h    = target.embed_tokens(block)                       (the target's table)
  per layer (5):
     a = RMSNorm(h) w_in
     Q = q_norm(q_proj(a)); K/V of the block = k_norm(k_proj(a)), v_proj(a);
     K/V of the context rows = k_norm(k_proj(ctx)), v_proj(ctx)     (same weights)
     RoPE (NeoX, rotate_half) on Q/K at their absolute positions
     attention over [context keys ; block keys], no causal mask inside the block
     h = h + o_proj(attn);  h = h + mlp(RMSNorm(h) w_post)
  logits = target.lm_head(RMSNorm(h) w_norm); rows 1.. are the proposals.
Context keys: rows before the anchor, limited to the 64-row sink plus the last
`sliding_window` rows (the book's context ABI).  Norms are plain RMSNorm with
the weight applied as w (the dflash GGUF stores them unchanged).

`target_layers` are llama.cpp's one-based values: the INPUT of target layer v
(= the output of layer v-1, the Hugging Face target_layer_ids + 1), which is
what Glimmer.forward(hidden_layers=...) returns.
"""
import math
from dataclasses import dataclass, asdict, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import rms as _target_rms, rope_tables

SINK = 64  # DFLASH_CONTEXT_SINK_SIZE: part of the cache ABI, not GGUF metadata


@dataclass
class DraftConfig:
    vocab: int = 8192
    n_layer: int = 5
    n_embd: int = 512
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 1024
    block_size: int = 16
    target_layers: list = field(default_factory=lambda: [1, 2, 4, 5, 7])
    sliding_window: int = 256
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    mask_token: int = 8190
    context_length: int = 1024

    def to_dict(self):
        return asdict(self)


def rms(x, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.eps) * self.weight.to(x.dtype)


def rope(x, pos, theta):
    """NeoX RoPE: x [B, N, H, D], pos [B, N] absolute positions."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d // 2, device=x.device, dtype=torch.float64) * 2 / d))
    ang = pos.to(torch.float64)[..., None] * inv
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().to(x.dtype)[:, :, None, :], ang.sin().to(x.dtype)[:, :, None, :]
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.n_embd, c.rms_eps)
        self.q_proj = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.n_embd, c.rms_eps)
        self.gate_proj = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.up_proj = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.down_proj = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def kv(self, x, pos):
        c = self.c
        B, N, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, N, c.n_head_kv, c.head_dim))
        v = self.v_proj(x).view(B, N, c.n_head_kv, c.head_dim)
        return rope(k, pos, c.rope_theta), v

    def forward(self, h, pos, ctx, ctx_pos, allowed):
        c = self.c
        B, N, _ = h.shape
        a = self.input_layernorm(h)
        q = rope(self.q_norm(self.q_proj(a).view(B, N, c.n_head, c.head_dim)), pos, c.rope_theta)
        kb, vb = self.kv(a, pos)
        kc, vc = self.kv(ctx, ctx_pos)
        k = torch.cat([kc, kb], dim=1).to(q.dtype)
        v = torch.cat([vc, vb], dim=1).to(q.dtype)
        rep = c.n_head // c.n_head_kv
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(c.head_dim)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=scale)
        else:   # old PyTorch (CPU checks)
            s = (q @ k.transpose(-1, -2)) * scale
            o = s.masked_fill(~allowed[:, None], float("-inf")).softmax(-1) @ v
        h = h + self.o_proj(o.transpose(1, 2).reshape(B, N, c.n_head * c.head_dim))
        f = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(f)) * self.up_proj(f))


class Draft(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(len(c.target_layers) * c.n_embd, c.n_embd, bias=False)
        self.hidden_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.rms_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for layer in self.layers:
            nn.init.normal_(layer.o_proj.weight, std=0.02 / math.sqrt(2 * c.n_layer))
            nn.init.normal_(layer.down_proj.weight, std=0.02 / math.sqrt(2 * c.n_layer))

    def forward(self, target, feats, anchors, tokens):
        """Draft logits for blocks at `anchors`.
        feats [B, T, n_t*E] target hidden states of the sequence; tokens [B, T];
        anchors [B, A] positions p (block = tokens[p], MASK...; context = rows < p).
        Returns logits [B, A, block_size, V]."""
        c = self.c
        B, T, _ = feats.shape
        A, S = anchors.shape[1], c.block_size
        dev = feats.device
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(T, device=dev).expand(B, T)
        ids = torch.full((B, A, S), c.mask_token, dtype=torch.long, device=dev)
        ids[:, :, 0] = tokens.gather(1, anchors)
        pos = (anchors[:, :, None] + torch.arange(S, device=dev)).reshape(B, A * S)
        h = target.embed_tokens(ids.view(B, A * S)).to(ctx.dtype)
        p = anchors.repeat_interleave(S, dim=1)[:, :, None]                 # [B, A*S, 1]
        j = torch.arange(T, device=dev)[None, None, :]
        ctx_ok = (j < p) & ((j < SINK) | (j >= p - c.sliding_window))
        blk = torch.arange(A, device=dev).repeat_interleave(S)
        blk_ok = (blk[:, None] == blk[None, :]).expand(B, A * S, A * S)
        allowed = torch.cat([ctx_ok, blk_ok], dim=2)
        for layer in self.layers:
            h = layer(h, pos, ctx, ctx_pos, allowed)
        h = self.norm(h)
        return target.lm_head(h.to(target.lm_head.weight.dtype)).view(B, A, S, -1)


def target_features(target, tokens, layers):
    _, hidden = target(tokens, hidden_layers=set(layers), last_only=True)
    order = sorted(layers)
    return torch.cat([hidden[order.index(v)] for v in layers], dim=-1)


@torch.no_grad()
def greedy_generate_recompute(target, prompts, n_new):
    """The reference: every step runs the whole sequence again."""
    seq = prompts
    for _ in range(n_new):
        logits = target(seq, last_only=True)
        seq = torch.cat([seq, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    return seq


def _cached_rows(target, ids, pos0, caches):
    """Logits of the last of rows ids [B, T] at positions pos0.., with every
    earlier row's K/V in caches (one (K, V) per layer, appended to here):
    Glimmer.forward's arithmetic for these rows (model.py), so a greedy
    step costs one row instead of the whole sequence."""
    cfg = target.cfg
    B, T = ids.shape
    dev = ids.device
    x = _target_rms(target.embed_tokens(ids), cfg.rms_eps)
    cos, sin = rope_tables(cfg, pos0 + T, dev, x.dtype)
    cos, sin = cos[pos0:, None, :], sin[pos0:, None, :]
    qp = torch.arange(pos0, pos0 + T, device=dev)[:, None]
    kp = torch.arange(pos0 + T, device=dev)[None, :]
    causal = kp <= qp
    sliding = causal & (qp - kp < cfg.sliding_window)
    rep = cfg.n_head // cfg.n_head_kv
    for il, layer in enumerate(target.layers):
        at = layer.self_attn
        q, k, v, g = at.qkvg(layer.input_layernorm(x), cos, sin)
        dt = v.dtype   # as Attention.forward: q/k in v's type
        k = k.to(dt)
        if caches[il] is not None:
            k = torch.cat([caches[il][0], k], dim=1)
            v = torch.cat([caches[il][1], v], dim=1)
        caches[il] = (k, v)
        qh, kh, vh = q.to(dt).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        allowed = sliding if at.swa else causal
        scale = 1.0 / math.sqrt(cfg.head_dim)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=scale)
        else:   # old PyTorch (CPU checks)
            sc = (qh @ kh.transpose(-1, -2)) * scale
            a = sc.masked_fill(~allowed, float("-inf")).softmax(-1) @ vh
        a = a.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.head_dim)
        x = x + layer.post_attention_layernorm(at.o_proj(a * torch.sigmoid(g)))
        x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
    x = x[:, -1:]
    x = _target_rms(x, cfg.rms_eps) * target.norm.to(x.dtype)
    logits = target.lm_head(x) * cfg.logit_scale
    return cfg.softcap * torch.tanh(logits / cfg.softcap)


@torch.no_grad()
def greedy_generate(target, prompts, n_new):
    """The target's greedy continuation of prompts [B, P] by n_new tokens over
    a K/V cache (the same tokens as greedy_generate_recompute up to float
    rounding: tools/train/selftest_greedy.py compares them)."""
    caches = [None] * target.cfg.n_layer
    seq, ids, pos0 = prompts, prompts, 0
    for _ in range(n_new):
        logits = _cached_rows(target, ids, pos0, caches)
        pos0 += ids.shape[1]
        ids = logits[:, -1].float().argmax(-1, keepdim=True)
        seq = torch.cat([seq, ids], dim=1)
    return seq


@torch.no_grad()
def acceptance(draft, target, seqs, feats, start, verify_len):
    """Greedy speculative decoding simulated on target-greedy sequences: the
    first anchor is the first generated token (position `start`); each verify
    step accepts the longest prefix of the draft that equals the target's
    greedy tokens (at most verify_len) plus the target's bonus token.
    Returns (verify steps, tokens committed, drafts accepted)."""
    B, T = seqs.shape
    S = draft.c.block_size
    p = torch.full((B,), start, dtype=torch.long, device=seqs.device)
    steps = tokens = accepted = 0
    while True:
        live = p <= T - S                     # a whole block still fits in the sequence
        if not live.any():
            break
        anchors = torch.where(live, p, torch.zeros_like(p))[:, None]
        logits = draft(target, feats, anchors, seqs)[:, 0]           # [B, S, V]
        prop = logits[:, 1:verify_len + 1].float().argmax(-1)        # [B, VL]
        truth = seqs.gather(1, anchors + 1 + torch.arange(verify_len, device=seqs.device))
        k = torch.cumprod((prop == truth).int(), dim=1).sum(1)
        k = torch.where(live, k, torch.zeros_like(k))
        steps += int(live.sum())
        tokens += int((k + 1)[live].sum())
        accepted += int(k.sum())
        p = torch.where(live, p + k + 1, p)
    return steps, tokens, accepted

"""Muse Glimmer in PyTorch, scaled down (glimmer-tiny), written from the book.

Layout is the Hugging Face one that llama.cpp's converter expects:
  * norm weights of the four per-layer RMSNorms are stored as w and applied as
    (1 + w) (the exporter writes w + 1); the final norm is applied as w;
  * RoPE uses rotate_half (first half / second half of each head); the
    exporter permutes Q/K rows into ggml's interleaved (NORM) layout;
  * QK-norm is a scaleless RMSNorm, then Q is multiplied by qk_scale_factor.

Forward, per the book (Ch 10-19):
  x = rms(embed[ids])                                     (no weight)
  per layer:  h = rms(x)(1+w_attn)
              q,k,v,g = h Wq, h Wk, h Wv, h Wgate
              q = rms_head(q) * qk_scale; k = rms_head(k)
              RoPE(q,k) on sliding-window layers only (NoPE on full layers)
              a = softmax(q k^T / sqrt(hd) + mask) v      (GQA, SWA mask on SWA layers)
              a = (a * sigmoid(g)) Wo
              x = x + rms(a, 1e-8)(1+w_post_attn)
              h = rms(x)(1+w_ffn);  f = (silu(h Wg) * h Wu) Wd
              x = x + rms(f, 1e-8)(1+w_post_ffn)
  logits = softcap(rms(x) w_final Wout * logit_scale),  softcap(z) = c tanh(z/c)
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 8192
    n_layer: int = 8
    n_embd: int = 512
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 1024
    sliding_window: int = 128
    swa_period: int = 4            # layers il % 4 < 3 are sliding, every 4th is full
    rope_theta_swa: float = 500000.0
    rope_theta: float = 500000.0   # written to rope.freq_base; full layers use no RoPE
    rms_eps: float = 1e-5
    post_norm_eps: float = 1e-8
    qk_scale_factor: float = 4.0
    logit_scale: float = 0.25
    softcap: float = 20.0
    context_length: int = 1024
    dropout: float = 0.0
    kv_round_f16: bool = False     # reference only: emulate an f16 KV cache (golden logits)

    def is_swa(self, il):
        return il % self.swa_period < self.swa_period - 1

    def to_dict(self):
        return asdict(self)


def rms(x, eps):
    x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class ShiftedRMSNorm(nn.Module):
    """RMSNorm with weight stored as w and applied as (1 + w) (HF Gemma style)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.eps) * (1.0 + self.weight.to(x.dtype))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_tables(cfg, seq, device, dtype):
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta_swa ** (torch.arange(0, half, device=device, dtype=torch.float64) * 2 / cfg.head_dim))
    pos = torch.arange(seq, device=device, dtype=torch.float64)
    ang = torch.outer(pos, inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg, il):
        super().__init__()
        self.cfg = cfg
        self.swa = cfg.is_swa(il)
        q_dim = cfg.n_head * cfg.head_dim
        kv_dim = cfg.n_head_kv * cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, q_dim, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, kv_dim, bias=False)
        self.gate_proj = nn.Linear(cfg.n_embd, q_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, cfg.n_embd, bias=False)

    def qkvg(self, h, c, s):
        """q, k (normed; rotated on sliding layers by the rows' tables c, s
        [T, 1, head_dim]), v (K and V rounded as the engines' cache stores
        them) and the gate of rows h [B, T, n_embd]."""
        cfg = self.cfg
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, cfg.n_head, cfg.head_dim)
        k = self.k_proj(h).view(B, T, cfg.n_head_kv, cfg.head_dim)
        v = self.v_proj(h).view(B, T, cfg.n_head_kv, cfg.head_dim)
        g = self.gate_proj(h)
        q = rms(q, cfg.rms_eps) * cfg.qk_scale_factor
        k = rms(k, cfg.rms_eps)
        if self.swa:
            q = q * c + rotate_half(q) * s
            k = k * c + rotate_half(k) * s
        if cfg.kv_round_f16:   # the engines' KV cache stores K (after RoPE) and V as f16
            k = k.to(torch.float16).to(k.dtype)
            v = v.to(torch.float16).to(v.dtype)
        return q, k, v, g

    def forward(self, h, cos, sin, swa_mask):
        cfg = self.cfg
        B, T, _ = h.shape
        q, k, v, g = self.qkvg(h, cos[:T, None, :], sin[:T, None, :])
        dt = v.dtype   # under autocast RoPE promoted q/k to f32
        q, k, v = q.to(dt).transpose(1, 2), k.to(dt).transpose(1, 2), v.transpose(1, 2)
        rep = cfg.n_head // cfg.n_head_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        if not hasattr(F, "scaled_dot_product_attention"):   # old PyTorch (CPU checks)
            allowed = swa_mask[:T, :T] if self.swa else torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            s = (q @ k.transpose(-1, -2)) * scale
            a = s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
        elif self.swa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=swa_mask[:T, :T], scale=scale)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        a = a.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.head_dim)
        return self.o_proj(a * torch.sigmoid(g))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.n_ff, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.n_ff, bias=False)
        self.down_proj = nn.Linear(cfg.n_ff, cfg.n_embd, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Layer(nn.Module):
    def __init__(self, cfg, il):
        super().__init__()
        self.input_layernorm = ShiftedRMSNorm(cfg.n_embd, cfg.rms_eps)
        self.self_attn = Attention(cfg, il)
        self.post_attention_layernorm = ShiftedRMSNorm(cfg.n_embd, cfg.post_norm_eps)
        self.pre_feedforward_layernorm = ShiftedRMSNorm(cfg.n_embd, cfg.rms_eps)
        self.mlp = MLP(cfg)
        self.post_feedforward_layernorm = ShiftedRMSNorm(cfg.n_embd, cfg.post_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, swa_mask):
        a = self.self_attn(self.input_layernorm(x), cos, sin, swa_mask)
        x = x + self.drop(self.post_attention_layernorm(a))
        f = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.drop(self.post_feedforward_layernorm(f))


class Glimmer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg, il) for il in range(cfg.n_layer))
        self.norm = nn.Parameter(torch.ones(cfg.n_embd))    # final norm: applied as w
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)
        self.apply(self._init)
        for layer in self.layers:   # residual-branch outputs start small
            nn.init.normal_(layer.self_attn.o_proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))
            nn.init.normal_(layer.mlp.down_proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=1.0)

    def swa_mask(self, T, device):
        i = torch.arange(T, device=device)
        d = i[:, None] - i[None, :]
        return (d >= 0) & (d < self.cfg.sliding_window)   # True = may attend

    def forward(self, ids, hidden_layers=None, last_only=False):
        """Logits [B,T,V] ([B,1,V] with last_only); with hidden_layers, also the
        inputs of those layers (what llama.cpp exposes as t_layer_inp) for the
        DFlash assistant."""
        cfg = self.cfg
        T = ids.shape[1]
        x = rms(self.embed_tokens(ids), cfg.rms_eps)
        cos, sin = rope_tables(cfg, T, ids.device, x.dtype)
        mask = self.swa_mask(T, ids.device)
        hidden = []
        for il, layer in enumerate(self.layers):
            if hidden_layers is not None and il in hidden_layers:
                hidden.append(x)
            x = layer(x, cos, sin, mask)
        if last_only:
            x = x[:, -1:]
        x = rms(x, cfg.rms_eps) * self.norm.to(x.dtype)
        logits = self.lm_head(x) * cfg.logit_scale
        logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        return (logits, hidden) if hidden_layers is not None else logits

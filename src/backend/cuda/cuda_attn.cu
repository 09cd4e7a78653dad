/* Decode attention (cuda_attn.h): a few query rows, each over its own
 * sequence's keys, exact to the reference (docs/numerics.md, "Attention").
 *
 * k_attn_dec: a CTA of 256 threads per (row, KV head, 256-key block, group
 * of HG query heads of that KV head). The block's keys are converted once
 * for the group, not once per query head as in k_attn_blocks:
 *  - K is staged in shared memory with each key split in quarters: quarter
 *    j holds dims j, j+4, j+8, ... (the dims of the 32-lane dot's chains
 *    l = j (mod 4));
 *  - scores: 4 threads per key, thread j running the 8 chains l = j + 4m
 *    of every head (fmaf over d = l, l+32, ... in order); the fold's steps
 *    h = 16, 8, 4 add chains of the same thread, h = 2, 1 a partner's (xor
 *    shuffle), so each addition is the reference's p[l] = p[l] + p[l+h];
 *  - m_b: a scan of contiguous key ranges combined in key order (the
 *    first of equal values wins, as in the reference's `s > m` scan);
 *    e_p = mu_expf(s_p - m_b);
 *  - acc_b[d] = fmaf(e_p, v_p[d], acc_b[d]) over the keys in order, a
 *    thread per (DPT dims, up to 4 heads), V asked of L2 at the start and
 *    copied into K's shared memory once the scores are done; l_b summed in
 *    key order by a thread per head.
 * k_attn_merge_scan: a CTA per (row, head), or per (row, 256 / D heads)
 * when it also applies the gate. The reference merges blocks
 * in order, M' = max(M, m_b), ca = mu_expf(M - M'), cb = mu_expf(m_b -
 * M'); M after block j is the maximum of m_0..m_j, so one warp per head
 * computes every M_j by a scan and every (ca, cb) at once; each thread
 * then runs only the multiply-add chain L = L*ca + l_b*cb, A[d] = A[d]*ca
 * + acc_b[d]*cb over the blocks in order.
 * With a gate (attention_gate, backend.h), the kernel that writes the
 * final values multiplies them by sigmoid(g) and quantizes whole Q8_K
 * blocks of them for the product after it: k_gate_q8's operations, so a
 * CTA must hold whole 256-value blocks (mucu_attn_dec's head groups).
 * Two other per-block passes write the same partials, bit for bit, for
 * calls over many blocks (mucu_attn_dec chooses): k_attn_dfl, one CTA per
 * SM walking the (row, KV head, block) units of up to 4 rows, and
 * k_attn_dcl, a cluster of 8 CTAs per block. */
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_prefill.h"
#include "backend/cuda/cuda_common.cuh"
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#define AD_NT 256

template <int DC, int HG> struct ad_cfg {
    static constexpr int D = 32 * DC;
    static constexpr int KW = 4 * DC;      /* words (f16 pairs) of a key's quarter */
    static constexpr int KJS = KW + 4;     /* padded: a quarter-warp's 2 keys x 4 quarters in distinct banks */
    static constexpr int KS = 4 * KJS;     /* words per key */
    static constexpr int QJS = 8 * DC + 4; /* floats per (head, quarter) of q, padded likewise */
    /* WIDE: one chain a thread on every thread (the group's HG * D chains
     * fill the CTA), each thread also summing its head's l_b; otherwise
     * 128 threads of HGT heads x DPT dims, and threads 128.. sum l_b */
    static constexpr bool WIDE = HG > 1 && HG * D <= AD_NT;
    static constexpr int HGT = WIDE ? 1 : HG < 4 ? HG : 4; /* heads per PV thread */
    static constexpr int NHQ = HG / HGT;
    static constexpr int DPT0 = D * NHQ / 128;
    static constexpr int DPT = WIDE || DPT0 < 1 ? 1 : DPT0 > 8 ? 8 : DPT0; /* dims per PV thread */
    static constexpr int NDQ = D / DPT;
    static constexpr int NPV = NDQ * NHQ; /* PV threads */
    static constexpr int SM_K = 256 * KS * 4, SM_Q = HG * 4 * QJS * 4, SM_S = 256 * HG * 4;
    static constexpr int TOTAL = SM_K + SM_Q + SM_S;
};

/* N consecutive f16 (N = 1, 2, 4, 8; 2N-byte aligned) of shared memory, in the low words. */
template <int N> __device__ static inline uint4 ld_halves_s(const uint16_t *p) {
    uint4 r = make_uint4(0, 0, 0, 0);
    if (N == 1) r.x = *p;
    else if (N == 2) r.x = *(const uint32_t *)p;
    else if (N == 4) {
        const uint2 t = *(const uint2 *)p;
        r.x = t.x, r.y = t.y;
    } else r = *(const uint4 *)p;
    return r;
}

__device__ static inline float half_at(uint4 r, int i) {
    const uint32_t w = i < 2 ? r.x : i < 4 ? r.y : i < 6 ? r.z : r.w;
    return h2f((uint16_t)(i & 1 ? w >> 16 : w & 0xFFFF));
}

/* K of keys [k0, k1) of the block into shared memory by quarter, key p at
 * row p - kbase: word c of quarter j holds dims 8c+j (low) and 8c+j+4.
 * BATCH 16-byte loads a thread in flight before their stores. */
template <int DC, int BATCH = 8>
__device__ static inline void ad_stage_k(uint32_t *ks, const mucu_attn_row &a, const int8_t *anc, const uint16_t *kb,
                                         int64_t start, int64_t phys0, int k0, int k1, int kbase = 0) {
    typedef ad_cfg<DC, 1> C; /* the key layout depends on DC alone */
    constexpr int CH = C::D / 8, KP = AD_NT / CH; /* a thread's piece c of keys p, p + KP, ... */
    const int c = (int)threadIdx.x % CH;
    const uint4 *kc = (const uint4 *)kb + c;
    with_key_rows(a, anc, start, phys0, k1, [&](auto row) {
        for (int p0 = k0 + (int)threadIdx.x / CH; p0 < k1; p0 += KP * BATCH) {
            uint4 buf[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; u++)
                if (p0 + u * KP < k1) buf[u] = __ldg(kc + row(p0 + u * KP) * CH);
#pragma unroll
            for (int u = 0; u < BATCH; u++)
                if (p0 + u * KP < k1) {
                    uint32_t *kr = ks + (p0 + u * KP - kbase) * C::KS + c;
                    kr[0] = __byte_perm(buf[u].x, buf[u].z, 0x5410);
                    kr[C::KJS] = __byte_perm(buf[u].x, buf[u].z, 0x7632);
                    kr[2 * C::KJS] = __byte_perm(buf[u].y, buf[u].w, 0x5410);
                    kr[3 * C::KJS] = __byte_perm(buf[u].y, buf[u].w, 0x7632);
                }
        }
    });
}

/* How many of the nk keys of a block from logical `start` the steps before
 * this one stored (ad_begin's rule, below): logical p <= pos - rows and
 * below a tree's base. */
__device__ static inline int settled_keys(const mucu_attn_row &a, int64_t start, int nk, int64_t rows) {
    int64_t last = a.pos - rows; /* the last settled key */
    if (a.tbase <= last) last = a.tbase - 1;
    const int64_t n = last - start + 1;
    return n <= 0 ? 0 : n < nk ? (int)n : nk;
}

/* The row's cache description and the L2 requests for the block's V rows
 * (read last), before the wait: the descriptions come with the step's
 * arguments, copied in before any kernel of the step runs, and a prefetch
 * is only a hint (a line the kernel before this one still writes is
 * updated in L2 all the same). With kst (the default; MUSER_CUDA_ATTN_KST=0 off) the K of
 * the block's settled keys is staged too: a key at logical p <= pos - rows
 * (rows: the call's rows, at least as many as any sequence's keys written
 * this step) and below a tree's base was written by an earlier step, and
 * its ring row is none of this step's (the ring holds every row's window
 * and this step's keys at once); nst: how many are staged. Then the
 * wait. */
template <int DC, int HG>
__device__ static inline mucu_attn_row ad_begin(const mucu_attn_row *__restrict__ desc, int64_t r, int64_t j,
                                                int64_t kh, const int8_t *&anc, uint32_t *ks, int kst, int &nst) {
    constexpr int D = 32 * DC;
    mucu_attn_row a = desc[r];
    const int64_t start = a.first + 256 * j;
    nst = 0;
    if (!a.treg && start <= a.pos) { /* a register row's keys are known only after the wait */
        const int nk = a.pos - start + 1 < 256 ? (int)(a.pos - start + 1) : 256;
        const int64_t phys0 = start % a.cap;
        if (kst) {
            nst = settled_keys(a, start, nk, gridDim.z);
            ad_stage_k<DC>(ks, a, desc[r].anc, a.k + kh * a.cap * D, start, phys0, 0, nst);
        }
        const uint16_t *vb = a.v + kh * a.cap * D;
        constexpr int LINES = D * 2 / 128;
        const uint16_t *vl = vb + ((int)threadIdx.x % LINES) * 64;
        with_key_rows(a, desc[r].anc, start, phys0, nk, [&](auto row) {
            for (int p = (int)threadIdx.x / LINES; p < nk; p += AD_NT / LINES)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(vl + row(p) * D));
        });
    }
    grid_dep_wait();
    anc = attn_row_resolve(a, desc, r);
    return a;
}

/* A quad's thread jq: its quarter of key row kr (K staged by quarter,
 * ks_quarter's layout) as floats; zeros for a dummy key. */
template <int DC, int KJS>
__device__ static inline void quad_key(const uint32_t *kr, int jq, bool live, float kf[8 * DC]) {
    if (live) {
        const uint4 *k4 = (const uint4 *)(kr + jq * KJS);
#pragma unroll
        for (int u = 0; u < DC; u++) {
            const uint4 w = k4[u];
#pragma unroll
            for (int i = 0; i < 8; i++) kf[8 * u + i] = half_at(w, i);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8 * DC; i++) kf[i] = 0.0f;
    }
}

/* The 32-lane dot of a key with q (qv: q's quarter jq, qs's layout), by a
 * quad: thread jq runs the 8 chains l = jq + 4m (fmaf over dims l + 32k in
 * order), the fold's h = 16, 8, 4 inside the thread and h = 2, 1 by xor
 * shuffles, each addition the reference's p[l] + p[l+h]; every lane of the
 * quad gets the dot, so every lane of the warp must call it. */
template <int DC>
__device__ static inline float quad_dot(const float4 *qv, const float kf[8 * DC]) {
    float pp[8];
#pragma unroll
    for (int m = 0; m < 8; m++) pp[m] = 0.0f;
#pragma unroll
    for (int k = 0; k < DC; k++) { /* dims l + 32k of the thread's chains l = jq + 4m */
        const float4 qa = qv[2 * k], qb = qv[2 * k + 1];
        const float qq[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
        for (int m = 0; m < 8; m++) pp[m] = fmaf(qq[m], kf[8 * k + m], pp[m]);
    }
    /* h = 16: l + 16 is chain m + 4; h = 8: m + 2; h = 4: m + 1 */
    const float a0 = pp[0] + pp[4], a1 = pp[1] + pp[5], a2 = pp[2] + pp[6], a3 = pp[3] + pp[7];
    const float b0 = a0 + a2, b1 = a1 + a3;
    const float c = b0 + b1;
    const float d2 = c + __shfl_xor_sync(FULL_MASK, c, 2);
    return d2 + __shfl_xor_sync(FULL_MASK, d2, 1);
}

/* m_b of each of the H heads over the block's nk scores S[p * H + h] into
 * m_s, then e_p = mu_expf(s_p - m_b) in place: thread (c, h) scans keys
 * c*H .. c*H+H-1 of head h, contiguous ranges combined left to right (the
 * first of equal values wins, as in the reference's `s > m` scan). H
 * divides 32; every thread of the CTA calls it. */
template <int NT = AD_NT> __device__ static inline void block_max_exp(float *S, int nk, int H, float *mw, float *m_s) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    {
        const int h = tid % H, c = tid / H;
        float m = -INFINITY;
        for (int i = 0; i < H; i++) {
            const int p = c * H + i;
            if (p < nk) {
                const float sv = S[p * H + h];
                if (sv > m) m = sv;
            }
        }
        for (int off = H; off < 32; off *= 2) {
            const float o = __shfl_down_sync(FULL_MASK, m, off);
            if (o > m) m = o;
        }
        if (lane < H) mw[warp * H + lane] = m; /* mw: [NT / 32][H] */
        __syncthreads();
        if (tid < H) {
            float mm = mw[tid];
            for (int w = 1; w < NT / 32; w++) {
                const float o = mw[w * H + tid];
                if (o > mm) mm = o;
            }
            m_s[tid] = mm;
        }
        __syncthreads();
    }
    for (int e = tid; e < nk * H; e += NT) S[e] = d_expf(S[e] - m_s[e % H]);
}

/* The weighted sums of a thread: acc[h][d] = fmaf(e_p, v_p[d], acc[h][d])
 * over the keys p < nk in order, e_p = S[p * stride + h] (the exps of HGT
 * heads), v_p[d] = vc[p * D + d] (DPT dims of V's row p in shared memory);
 * with LS, *l = the first head's l_b, its e_p summed in key order. */
template <int D, int HGT, int DPT, bool LS = false>
__device__ static inline void pv_chains(const float *S, int stride, const uint16_t *vc, int nk, float acc[HGT][DPT],
                                        float *l = nullptr) {
    float ls = 0.0f;
#pragma unroll
    for (int h = 0; h < HGT; h++)
#pragma unroll
        for (int d = 0; d < DPT; d++) acc[h][d] = 0.0f;
#pragma unroll 4
    for (int p = 0; p < nk; p++) {
        const float *ep = S + p * stride;
        float e[HGT];
        if constexpr (HGT == 4) {
            const float4 t = *(const float4 *)ep;
            e[0] = t.x, e[1] = t.y, e[2] = t.z, e[3] = t.w;
        } else {
#pragma unroll
            for (int h = 0; h < HGT; h++) e[h] = ep[h];
        }
        const uint4 raw = ld_halves_s<DPT>(vc + p * D);
        float vf[DPT];
#pragma unroll
        for (int d = 0; d < DPT; d++) vf[d] = half_at(raw, d);
#pragma unroll
        for (int h = 0; h < HGT; h++)
#pragma unroll
            for (int d = 0; d < DPT; d++) acc[h][d] = fmaf(e[h], vf[d], acc[h][d]);
        if (LS) ls = ls + e[0];
    }
    if (LS) *l = ls;
}

template <int DC, int HG, bool GATE>
__global__ static void __launch_bounds__(AD_NT, 2)
    k_attn_dec(const mucu_attn_row *__restrict__ desc, int64_t n_head, int64_t n_head_kv, float scale,
               const float *__restrict__ q, float *__restrict__ part, int64_t nbmax, float *__restrict__ final_out,
               const float *__restrict__ gate, q8split o, int kst) {
    typedef ad_cfg<DC, HG> C;
    constexpr int D = C::D, DPT = C::DPT, HGT = C::HGT;
    const int64_t j = blockIdx.x, r = blockIdx.z;
    const int64_t G = n_head / n_head_kv, ngr = G / HG;
    const int64_t kh = blockIdx.y / ngr, h0 = kh * G + (blockIdx.y % ngr) * HG;
    const int8_t *anc;
    extern __shared__ __align__(16) uint8_t sm[];
    uint32_t *ks = (uint32_t *)sm;
    int nst;
    const mucu_attn_row a = ad_begin<DC, HG>(desc, r, j, kh, anc, ks, kst, nst);
    float *qs = (float *)(sm + C::SM_K), *S = (float *)(sm + C::SM_K + C::SM_Q);
    __shared__ float mw[AD_NT / 32][HG], m_s[HG], l_s[HG];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int dq = tid % C::NDQ, hq = tid / C::NDQ;
    const int64_t start = a.first + 256 * j;
    if (start > a.pos) return;
    /* GATE (one block: the output is final): this thread's gate values,
     * asked for now so that they are here when the weighted sums end */
    float gv[HGT][DPT];
    if (GATE && tid < C::NPV) {
#pragma unroll
        for (int h = 0; h < HGT; h++)
#pragma unroll
            for (int d = 0; d < DPT; d++) gv[h][d] = gate[(r * n_head + h0 + hq * HGT + h) * D + dq * DPT + d];
    }
    const int nk = a.pos - start + 1 < 256 ? (int)(a.pos - start + 1) : 256;
    const uint16_t *kb = a.k + kh * a.cap * D, *vb = a.v + kh * a.cap * D;
    const int64_t phys0 = start % a.cap;
    /* q of the group's heads, by quarter: qs[(g*4 + j)*QJS + i] = q_g[j + 4i] */
    const float *qr = q + (r * n_head + h0) * D;
    for (int e = tid; e < HG * D; e += AD_NT) {
        const int g = e / D, d = e % D;
        qs[(g * 4 + (d & 3)) * C::QJS + (d >> 2)] = qr[e];
    }
    /* K by quarter (the settled keys' are staged already) */
    constexpr int CH = D / 8;
    ad_stage_k<DC>(ks, a, anc, kb, start, phys0, nst, nk);
    __syncthreads();

    /* scores: the quad of threads 4pl .. 4pl+3 takes key pl, pl+64, ...;
     * every quad runs the same count (dummy keys store nothing) so that the
     * shuffles see all lanes */
    {
        const int jq = tid & 3, pl = tid >> 2, nkr = (nk + 63) & ~63;
        for (int p = pl; p < nkr; p += AD_NT / 4) {
            float kf[8 * DC];
            quad_key<DC, C::KJS>(ks + p * C::KS, jq, p < nk, kf);
#pragma unroll 2
            for (int g = 0; g < HG; g++) {
                const float e = quad_dot<DC>((const float4 *)(qs + (g * 4 + jq) * C::QJS), kf);
                if (p < nk && jq == (g & 3)) S[p * HG + g] = e * scale;
            }
        }
    }
    __syncthreads();
    /* the scores are done with K: V's rows (in L2 by now) go to its region
     * while m_b and e_p are computed */
    uint16_t *vs = (uint16_t *)sm;
    with_key_rows(a, anc, start, phys0, nk, [&](auto row) {
        const int c = tid % CH;
        for (int p = tid / CH; p < nk; p += AD_NT / CH) cp16(vs + (p * CH + c) * 8, vb + row(p) * D + c * 8, true);
    });
    cp_commit();
    block_max_exp(S, nk, HG, &mw[0][0], m_s);
    cp_wait<0>();
    __syncthreads();

    float acc[HGT][DPT];
    if constexpr (C::WIDE) {
        float l;
        if (tid < C::NPV) pv_chains<D, 1, 1, true>(S + hq, HG, vs + dq, nk, acc, &l);
        if (tid < C::NPV && dq == 0) {
            l_s[hq] = l;
            if (!final_out) {
                float *pb = part + ((r * n_head + h0 + hq) * nbmax + j) * (D + 2);
                pb[0] = m_s[hq], pb[1] = l;
            }
        }
    } else if (tid < C::NPV) {
        pv_chains<D, HGT, DPT>(S + hq * HGT, HG, vs + dq * DPT, nk, acc);
    } else if (tid >= 128 && tid < 128 + HG) {
        const int g = tid - 128;
        float l = 0.0f;
        for (int p = 0; p < nk; p++) l = l + S[p * HG + g];
        l_s[g] = l;
        if (!final_out) {
            float *pb = part + ((r * n_head + h0 + g) * nbmax + j) * (D + 2);
            pb[0] = m_s[g], pb[1] = l;
        }
    }
    if (final_out) __syncthreads(); /* l_s (final_out is the same for the whole grid); K/V's region is free */
    float *stage = (float *)sm; /* GATE with o.qs: the gated rows of the CTA's heads, for their quantization */
    if (tid < C::NPV) {
#pragma unroll
        for (int h = 0; h < HGT; h++) {
            const int g = hq * HGT + h;
            const int64_t rh = r * n_head + h0 + g;
            if (GATE) { /* k_gate_q8's operations on the values attention would have written */
#pragma unroll
                for (int d = 0; d < DPT; d++) {
                    const float v = (acc[h][d] / l_s[g]) * d_sigmoidf(gv[h][d]);
                    final_out[rh * D + dq * DPT + d] = v;
                    if (o.qs) stage[g * D + dq * DPT + d] = v;
                }
            } else if (final_out) {
#pragma unroll
                for (int d = 0; d < DPT; d++) final_out[rh * D + dq * DPT + d] = acc[h][d] / l_s[g];
            } else {
                float *pb = part + (rh * nbmax + j) * (D + 2) + 2 + dq * DPT;
#pragma unroll
                for (int d = 0; d < DPT; d++) pb[d] = acc[h][d];
            }
        }
    }
    if (GATE && o.qs) { /* HG * D is a multiple of 256 (mucu_attn_dec), and so is h0 * D */
        __syncthreads();
        for (int b = warp; b < HG * D / 256; b += AD_NT / 32) {
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = stage[b * 256 + lane * 8 + i];
            quantize_block_warp(v, o, ((r * n_head + h0) * D) / 256 + b, lane);
        }
    }
}

/* k_attn_dcl (MUSER_CUDA_ATTN_CL=1; calls that write per-block partials):
 * a cluster of CL_N CTAs per (row, KV head, 256-key block) and all G <= 16
 * query heads of that KV head. CTA c stages the K of keys 32c .. 32c+31
 * and computes their scores for every head (k_attn_dec's quad of threads
 * per key, the same chains and fold); through distributed shared memory
 * each CTA reads the others' maxima of their keys (m_b: the maximum, key
 * ranges combined left to right), computes e_p = mu_expf(s_p - m_b) of
 * its own keys, and then reads every CTA's e_p (each exp once a cluster);
 * CTA c then runs the weighted sums of dims c*DS .. c*DS+DS-1 (DS = D /
 * CL_N) of every head, from its slice of V, and l_b of heads c, c + CL_N.
 * Each key's K and V bytes are read once per cluster, where k_attn_dec's
 * G / HG CTAs of a block each read all of them. Before the wait the CTA
 * stages the K and V of the keys stored by earlier steps (ad_begin). */
#define CL_N 8

template <int DC> struct cl_cfg {
    static constexpr int D = 32 * DC, KW = 4 * DC, KJS = KW + 4, KS = 4 * KJS, QJS = 8 * DC + 4;
    static constexpr int KC = 256 / CL_N; /* keys whose scores a CTA computes */
    static constexpr int DS = D / CL_N;   /* dims whose sums a CTA runs */
    /* K loads a thread keeps in flight (ad_stage_k's BATCH): all of its keys' at once, at least 2 (with 1 ptxas
     * spilled at D 64) */
    static constexpr int NKB = (KC * D / 8 + AD_NT - 1) / AD_NT < 2 ? 2 : (KC * D / 8 + AD_NT - 1) / AD_NT;
    static constexpr int SM_K = KC * KS * 4, SM_V = 256 * DS * 2, SM_Q = 16 * 4 * QJS * 4, SM_SL = KC * 16 * 4,
                         SM_S = 256 * 16 * 4;
    static constexpr int O_V = SM_K, O_Q = O_V + SM_V, O_SL = O_Q + SM_Q, O_S = O_SL + SM_SL, TOTAL = O_S + SM_S;
};

/* K of the CTA's keys in [k0, k1) (block-relative, within 32c .. 32c+31) by quarter (ad_stage_k), and V's slice
 * of keys [v0, v1). */
template <int DC>
__device__ static inline void cl_stage(uint32_t *ks, uint16_t *vs, const mucu_attn_row &a, const int8_t *anc,
                                       const uint16_t *kb, const uint16_t *vb, int64_t start, int64_t phys0, int c,
                                       int k0, int k1, int v0, int v1) {
    typedef cl_cfg<DC> C;
    static_assert(C::KS == ad_cfg<DC, 1>::KS && C::KJS == ad_cfg<DC, 1>::KJS, "k_attn_dec's key layout");
    constexpr int D = C::D, VCH = C::DS / 8; /* 16-byte pieces of a key's V slice */
    ad_stage_k<DC, C::NKB>(ks, a, anc, kb, start, phys0, k0, k1, c * C::KC);
    const int tid = threadIdx.x;
    with_key_rows(a, anc, start, phys0, v1, [&](auto row) {
        const int q = tid % VCH;
        for (int p = v0 + tid / VCH; p < v1; p += AD_NT / VCH)
            cp16(vs + p * C::DS + q * 8, vb + row(p) * D + c * C::DS + q * 8, true);
    });
    cp_commit();
}

__device__ static inline uint32_t cl_rank(void) {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ static inline void cl_arrive(void) { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ static inline void cl_wait(void) { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
/* The address in CTA `rank`'s shared memory of what p is in this CTA's. */
__device__ static inline uint32_t cl_map(const void *p, uint32_t rank) {
    uint32_t ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
    return ra;
}
/* 16 bytes (cl_load4) or a float (cl_load1) of CTA `rank`'s shared memory at
 * the address of p in this CTA's (after a cluster barrier: volatile keeps
 * it after the barrier's asm; no memory clobber, so several are in flight
 * at once). */
__device__ static inline float4 cl_load4(const float4 *p, uint32_t rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(cl_map(p, rank)));
    return v;
}
__device__ static inline float cl_load1(const float *p, uint32_t rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cl_map(p, rank)));
    return v;
}

/* The keys stored by earlier steps (ad_begin's rule): their K (the CTA's
 * keys) and V (the CTA's dims) staged before the wait; nst: how many. Then
 * the wait. */
template <int DC>
__device__ static inline mucu_attn_row cl_begin(const mucu_attn_row *__restrict__ desc, int64_t r, int64_t j,
                                                int64_t kh, int c, uint32_t *ks, uint16_t *vs, int &nst) {
    constexpr int D = 32 * DC, KC = cl_cfg<DC>::KC;
    mucu_attn_row a = desc[r];
    const uint16_t *kb = a.k + kh * a.cap * D, *vb = a.v + kh * a.cap * D;
    const int64_t start = a.first + 256 * j;
    nst = 0;
    if (!a.treg && start <= a.pos) {
        nst = settled_keys(a, start, a.pos - start + 1 < 256 ? (int)(a.pos - start + 1) : 256, gridDim.z);
        const int k0 = c * KC, k1 = nst < k0 + KC ? nst : k0 + KC;
        cl_stage<DC>(ks, vs, a, desc[r].anc, kb, vb, start, start % a.cap, c, k0, k1 > k0 ? k1 : k0, 0, nst);
    }
    grid_dep_wait();
    return a;
}

template <int DC>
__global__ static void __cluster_dims__(CL_N, 1, 1) __launch_bounds__(AD_NT)
    k_attn_dcl(const mucu_attn_row *__restrict__ desc, int64_t n_head, int64_t n_head_kv, float scale,
               const float *__restrict__ q, float *__restrict__ part, int64_t nbmax) {
    typedef cl_cfg<DC> C;
    constexpr int D = C::D, DS = C::DS, KC = C::KC;
    extern __shared__ __align__(16) uint8_t sm[];
    uint32_t *ks = (uint32_t *)sm;
    uint16_t *vs = (uint16_t *)(sm + C::O_V);
    float *qs = (float *)(sm + C::O_Q), *SL = (float *)(sm + C::O_SL), *S = (float *)(sm + C::O_S);
    __shared__ float LM[16], m_s[16];
    const int c = (int)cl_rank(), tid = threadIdx.x;
    const int64_t j = blockIdx.x / CL_N, kh = blockIdx.y, r = blockIdx.z;
    const int G = (int)(n_head / n_head_kv);
    const int64_t h0 = kh * G;
    int nst;
    mucu_attn_row a = cl_begin<DC>(desc, r, j, kh, c, ks, vs, nst);
    const uint16_t *kb = a.k + kh * a.cap * D, *vb = a.v + kh * a.cap * D;
    const int8_t *anc = attn_row_resolve(a, desc, r);
    const int64_t start = a.first + 256 * j;
    if (start > a.pos) return; /* the same for every CTA of the cluster */
    const int nk = a.pos - start + 1 < 256 ? (int)(a.pos - start + 1) : 256;
    const int64_t phys0 = start % a.cap;
    {
        const int k0 = c * KC > nst ? c * KC : nst, k1 = nk < c * KC + KC ? nk : c * KC + KC;
        cl_stage<DC>(ks, vs, a, anc, kb, vb, start, phys0, c, k0, k1 > k0 ? k1 : k0, nst, nk);
    }
    {
        const float *qr = q + (r * n_head + h0) * D;
        constexpr int NQ = 16 * D / AD_NT; /* every load in flight before the first store */
        float qv[NQ];
#pragma unroll
        for (int u = 0; u < NQ; u++)
            if (tid + u * AD_NT < G * D) qv[u] = qr[tid + u * AD_NT];
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            const int e = tid + u * AD_NT, g = e / D, d = e % D;
            if (e < G * D) qs[(g * 4 + (d & 3)) * C::QJS + (d >> 2)] = qv[u];
        }
    }
    __syncthreads();
    /* scores of the CTA's keys: quad qd takes key qd % 32 and heads qd / 32, + 2, ... */
    {
        const int jq = tid & 3, qd = tid >> 2, kk = qd % KC, hs = qd / KC, p = c * KC + kk;
        float kf[8 * DC];
        quad_key<DC, C::KJS>(ks + kk * C::KS, jq, p < nk, kf);
        for (int g = hs; g < G; g += AD_NT / 4 / KC) {
            const float e = quad_dot<DC>((const float4 *)(qs + (g * 4 + jq) * C::QJS), kf);
            if (jq == (g & 3)) SL[kk * G + g] = e * scale;
        }
    }
    __syncthreads();
    /* each head's maximum over this CTA's keys, then m_b from the CTAs' in
     * CTA order (key ranges left to right, as block_max_exp combines them) */
    if (tid < G) {
        float m = -INFINITY;
        for (int kk = 0; kk < KC; kk++)
            if (c * KC + kk < nk) {
                const float sv = SL[kk * G + tid];
                if (sv > m) m = sv;
            }
        LM[tid] = m;
    }
    cl_arrive();
    cl_wait();
    if (tid < G) {
        float m = cl_load1(LM + tid, 0);
        for (int cc = 1; cc < CL_N; cc++) {
            const float o = cl_load1(LM + tid, (uint32_t)cc);
            if (o > m) m = o;
        }
        m_s[tid] = m;
    }
    __syncthreads();
    /* e_p of this CTA's keys only (each key's once per cluster), in place */
    for (int e = tid; e < KC * G; e += AD_NT) SL[e] = d_expf(SL[e] - m_s[e % G]);
    cl_arrive();
    cl_wait();
    /* every CTA's e_p into S (p * G + g): CTA c' holds S[32c'G .. 32(c'+1)G) */
    {
        constexpr int NS = 256 * 16 / 4 / AD_NT;
        const int n4 = KC * G / 4; /* float4s per CTA */
        float4 v[NS];
#pragma unroll
        for (int u = 0; u < NS; u++) {
            const int i = tid + u * AD_NT;
            if (i < CL_N * n4) v[u] = cl_load4((const float4 *)SL + i % n4, (uint32_t)(i / n4));
        }
#pragma unroll
        for (int u = 0; u < NS; u++) {
            const int i = tid + u * AD_NT;
            if (i < CL_N * n4) ((float4 *)S)[i] = v[u];
        }
    }
    cl_arrive(); /* this CTA has read the others' e_p; the wait comes before the exit */
    cp_wait<0>();
    __syncthreads();
    /* the weighted sums: chain (g, d) for g < G, d < DS, two heads a thread where G allows; l_b by threads past them */
    const int HP = G >= 2 ? 2 : 1, npv = G * DS / HP;
    for (int t = tid; t < npv; t += AD_NT) {
        const int d = t % DS, g = (t / DS) * HP;
        float acc0 = 0.0f, acc1 = 0.0f;
        const uint16_t *vc = vs + d;
        if (HP == 2) {
#pragma unroll 8
            for (int p = 0; p < nk; p++) {
                const float2 e = *(const float2 *)(S + p * G + g);
                const float v = h2f(vc[p * DS]);
                acc0 = fmaf(e.x, v, acc0);
                acc1 = fmaf(e.y, v, acc1);
            }
        } else {
#pragma unroll 8
            for (int p = 0; p < nk; p++) acc0 = fmaf(S[p * G + g], h2f(vc[p * DS]), acc0);
        }
        float *pb = part + ((r * n_head + h0 + g) * nbmax + j) * (D + 2) + 2 + c * DS + d;
        pb[0] = acc0;
        if (HP == 2) pb[nbmax * (D + 2)] = acc1;
    }
    {
        const int lt = npv < AD_NT ? npv : 0; /* threads lt, lt + 1, ...: heads c, c + CL_N, ... */
        const int i = tid - lt, g = c + CL_N * i;
        if (i >= 0 && g < G) {
            float l = 0.0f;
#pragma unroll 8
            for (int p = 0; p < nk; p++) l = l + S[p * G + g];
            float *pb = part + ((r * n_head + h0 + g) * nbmax + j) * (D + 2);
            pb[0] = m_s[g], pb[1] = l;
        }
    }
    cl_wait();
}

/* k_attn_dfl (MUSER_CUDA_ATTN_FL=N; calls that write per-block partials
 * over N or more units, a unit being a (row, KV head, 256-key block)): one
 * CTA of FL_NT threads per SM, walking the units u = blockIdx.x,
 * blockIdx.x + gridDim.x, ...; each unit is k_attn_dec's work for all G
 * query heads of its KV head (HG = G: the same scores, chains, fold,
 * maximum, exp, sums in key order), so the outputs are the same bits.
 * What differs is where the time goes (docs/cuda.md "Decode attention"):
 *  - K and V reach shared memory only by cp.async, as they lie in the cache
 *    (K's rows padded by 16 bytes), the first unit's settled keys (ad_begin's
 *    rule) before the wait; a quad's thread jq picks dims jq and jq + 4 of
 *    each 16-byte piece, which is quad_key's quarter, so quad_dot runs
 *    unchanged (4x the shared loads of the quarter layout, spread over the
 *    G heads that share each key);
 *  - the next unit's K is asked for as soon as this unit's scores are done,
 *    its V once this unit's weighted sums are: one unit's loads under the
 *    other's arithmetic, where k_attn_dec and k_attn_dcl run a wave per
 *    256-key block;
 *  - 512 threads: 128 quads take two keys each, 256 threads the weighted
 *    sums (HGT heads x DPT dims each), G more the l_b chains. */
#define FL_NT 512

template <int DC, int G> struct fl_cfg {
    static constexpr int D = 32 * DC;
    static constexpr int KRS = 2 * D + 16;        /* bytes per K row: the quads' 2 keys a phase in distinct banks */
    static constexpr int QJS = 8 * DC + 4;        /* k_attn_dec's q layout (quad_dot) */
    static constexpr int HGT = G < 4 ? G : 4, NHQ = G / HGT;
    static constexpr int DPT0 = D * NHQ / (FL_NT / 2);
    static constexpr int DPT = DPT0 < 1 ? 1 : DPT0 > 8 ? 8 : DPT0;
    static constexpr int NDQ = D / DPT, NPV = NDQ * NHQ; /* PV threads (<= FL_NT / 2); l_b: FL_NT / 2 .. + G */
    static constexpr int O_V = 256 * KRS, O_Q = O_V + 256 * D * 2, O_S = O_Q + G * 4 * QJS * 4;
    static constexpr int TOTAL = O_S + 256 * G * 4;
    static_assert(NPV <= FL_NT / 2 && G <= 16 && 32 % G == 0, "k_attn_dfl's thread plan");
};

/* Keys [k0, k1) of the unit's block: their K or V rows (src) into shared
 * memory rows of rs bytes (dst), by cp.async. */
template <int DC>
__device__ static inline void fl_stage(uint8_t *dst, int rs, const uint16_t *src, const mucu_attn_row &a,
                                       const int8_t *anc, int64_t start, int k0, int k1) {
    constexpr int D = 32 * DC, CH = D / 8;
    const int c = (int)threadIdx.x % CH;
    with_key_rows(a, anc, start, start % a.cap, k1, [&](auto row) {
        for (int p = k0 + (int)threadIdx.x / CH; p < k1; p += FL_NT / CH)
            cp16(dst + p * rs + c * 16, src + row(p) * D + c * 8, true);
    });
}

/* The unit's row (resolved: after the wait), first key, keys. */
struct fl_unit {
    mucu_attn_row a;
    const int8_t *anc;
    int64_t r, kh, j, start;
    int nk;
};

__device__ static inline bool fl_at(const mucu_attn_row *__restrict__ desc, int64_t u, int64_t nbmax, int64_t n_head_kv,
                                    fl_unit &f) {
    f.j = u % nbmax, f.kh = (u / nbmax) % n_head_kv, f.r = u / nbmax / n_head_kv;
    f.a = desc[f.r];
    f.anc = attn_row_resolve(f.a, desc, f.r);
    f.start = f.a.first + 256 * f.j;
    if (f.start > f.a.pos) return false;
    f.nk = f.a.pos - f.start + 1 < 256 ? (int)(f.a.pos - f.start + 1) : 256;
    return true;
}

/* The first live unit at or after u (stride gridDim.x), or units. */
__device__ static inline int64_t fl_next(const mucu_attn_row *__restrict__ desc, int64_t u, int64_t units,
                                         int64_t nbmax, int64_t n_head_kv, fl_unit &f) {
    for (; u < units; u += gridDim.x)
        if (fl_at(desc, u, nbmax, n_head_kv, f)) return u;
    return units;
}

/* Before the wait: the first unit's settled keys (ad_begin's rule; a
 * register row's keys are known only after it), K and V, as one cp.async
 * group; how many. Then the wait. */
template <int DC, int G>
__device__ static inline int fl_begin(const mucu_attn_row *__restrict__ desc, int64_t rows, int64_t n_head_kv,
                                      int64_t nbmax, int kst, uint8_t *ks, uint8_t *vsb) {
    constexpr int D = 32 * DC;
    int pre = 0;
    if ((int64_t)blockIdx.x < rows * n_head_kv * nbmax) {
        const int64_t u = blockIdx.x, j = u % nbmax, kh = (u / nbmax) % n_head_kv, r = u / nbmax / n_head_kv;
        const mucu_attn_row a = desc[r];
        const int64_t start = a.first + 256 * j;
        if (kst && !a.treg && start <= a.pos) {
            pre = settled_keys(a, start, a.pos - start + 1 < 256 ? (int)(a.pos - start + 1) : 256, rows);
            fl_stage<DC>(ks, fl_cfg<DC, G>::KRS, a.k + kh * a.cap * D, a, desc[r].anc, start, 0, pre);
            fl_stage<DC>(vsb, 2 * D, a.v + kh * a.cap * D, a, desc[r].anc, start, 0, pre);
        }
    }
    cp_commit();
    grid_dep_wait();
    return pre;
}

template <int DC, int G>
__global__ static void __launch_bounds__(FL_NT, 1)
    k_attn_dfl(const mucu_attn_row *__restrict__ desc, int64_t rows, int64_t n_head, int64_t n_head_kv, float scale,
               const float *__restrict__ q, float *__restrict__ part, int64_t nbmax, int kst) {
    typedef fl_cfg<DC, G> C;
    constexpr int D = C::D, DPT = C::DPT, HGT = C::HGT;
    extern __shared__ __align__(16) uint8_t sm[];
    uint8_t *ks = sm, *vsb = sm + C::O_V;
    const uint16_t *vs = (const uint16_t *)vsb;
    float *qs = (float *)(sm + C::O_Q), *S = (float *)(sm + C::O_S);
    __shared__ float mw[FL_NT / 32 * G], m_s[G];
    const int tid = threadIdx.x;
    const int64_t units = rows * n_head_kv * nbmax;
    int pre = fl_begin<DC, G>(desc, rows, n_head_kv, nbmax, kst, ks, vsb);
    fl_unit f, fn;
    int64_t u = fl_next(desc, blockIdx.x, units, nbmax, n_head_kv, f);
    if (u != (int64_t)blockIdx.x) { /* (a plain row's liveness is the same before the wait and after it) */
        cp_wait<0>();
        pre = 0;
    }
    bool first = true;
    const int jq = tid & 3, qd = tid >> 2;
    while (u < units) {
        const int64_t h0 = f.kh * G;
        const int nk = f.nk;
        if (first) { /* the first unit's keys not staged before the wait */
            fl_stage<DC>(ks, C::KRS, f.a.k + f.kh * f.a.cap * D, f.a, f.anc, f.start, pre, nk);
            fl_stage<DC>(vsb, 2 * D, f.a.v + f.kh * f.a.cap * D, f.a, f.anc, f.start, pre, nk);
            cp_commit();
        }
        { /* q of the G heads, by quarter (k_attn_dec's layout) */
            const float *qr = q + (f.r * n_head + h0) * D;
            for (int e = tid; e < G * D; e += FL_NT) {
                const int g = e / D, d = e % D;
                qs[(g * 4 + (d & 3)) * C::QJS + (d >> 2)] = qr[e];
            }
        }
        if (first) cp_wait<0>();
        else cp_wait<1>(); /* K is here; V may still be on its way */
        __syncthreads();
        /* scores: quad qd takes keys qd and qd + 128 (both always, so that
         * the shuffles see every lane; a dead key stores nothing) */
#pragma unroll 1
        for (int p = qd; p < 256; p += FL_NT / 4) {
            const bool live = p < nk;
            float kf[8 * DC];
            if (live) {
                const uint8_t *kr = ks + p * C::KRS;
                const uint32_t sel = jq & 1 ? 0x7632 : 0x5410;
#pragma unroll
                for (int k = 0; k < DC; k++)
#pragma unroll
                    for (int i = 0; i < 4; i++) { /* dims 32k + 8i + jq and + 4: chains m = 2i, 2i + 1 */
                        const uint4 w = *(const uint4 *)(kr + (32 * k + 8 * i) * 2);
                        const uint32_t two = __byte_perm(jq & 2 ? w.y : w.x, jq & 2 ? w.w : w.z, sel);
                        kf[8 * k + 2 * i] = h2f((uint16_t)(two & 0xFFFF));
                        kf[8 * k + 2 * i + 1] = h2f((uint16_t)(two >> 16));
                    }
            } else {
#pragma unroll
                for (int i = 0; i < 8 * DC; i++) kf[i] = 0.0f;
            }
#pragma unroll 2
            for (int g = 0; g < G; g++) {
                const float e = quad_dot<DC>((const float4 *)(qs + (g * 4 + jq) * C::QJS), kf);
                if (live && jq == (g & 3)) S[p * G + g] = e * scale;
            }
        }
        __syncthreads(); /* K's region is free */
        const int64_t un = fl_next(desc, u + gridDim.x, units, nbmax, n_head_kv, fn);
        if (un < units) fl_stage<DC>(ks, C::KRS, fn.a.k + fn.kh * fn.a.cap * D, fn.a, fn.anc, fn.start, 0, fn.nk);
        cp_commit();
        block_max_exp<FL_NT>(S, nk, G, mw, m_s);
        cp_wait<1>(); /* this unit's V (the newest group is the next unit's K) */
        __syncthreads();
        if (tid < C::NPV) {
            const int dq = tid % C::NDQ, hq = tid / C::NDQ;
            float acc[HGT][DPT];
            pv_chains<D, HGT, DPT>(S + hq * HGT, G, vs + dq * DPT, nk, acc);
#pragma unroll
            for (int h = 0; h < HGT; h++) {
                float *pb = part + ((f.r * n_head + h0 + hq * HGT + h) * nbmax + f.j) * (D + 2) + 2 + dq * DPT;
#pragma unroll
                for (int d = 0; d < DPT; d++) pb[d] = acc[h][d];
            }
        } else if (tid >= FL_NT / 2 && tid < FL_NT / 2 + G) {
            const int g = tid - FL_NT / 2;
            float l = 0.0f;
#pragma unroll 8
            for (int p = 0; p < nk; p++) l = l + S[p * G + g];
            float *pb = part + ((f.r * n_head + h0 + g) * nbmax + f.j) * (D + 2);
            pb[0] = m_s[g], pb[1] = l;
        }
        __syncthreads(); /* V's region and S are free */
        if (un < units) fl_stage<DC>(vsb, 2 * D, fn.a.v + fn.kh * fn.a.cap * D, fn.a, fn.anc, fn.start, 0, fn.nk);
        cp_commit();
        u = un, f = fn, first = false;
    }
    cp_wait<0>(); /* nothing in flight at exit */
}

/* The row's cache description (the step's uploaded arguments, which no
 * kernel writes) before the wait, then the wait. */
template <int UNUSED>
__device__ static inline mucu_attn_row merge_begin(const mucu_attn_row *__restrict__ desc, int64_t r) {
    mucu_attn_row a = desc[r];
    grid_dep_wait();
    (void)attn_row_resolve(a, desc, r);
    return a;
}

/* A CTA per (row, HB consecutive heads), a thread per (head, dim); with
 * GATE (HB * D = 256: the CTA's values are one Q8_K block) the result is
 * gated and, with o.qs, quantized as k_gate_q8 would. */
template <bool GATE>
__global__ static void __launch_bounds__(512)
    k_attn_merge_scan(const mucu_attn_row *__restrict__ desc, int64_t n_head, int64_t D, int HB,
                      const float *__restrict__ part, int64_t nbmax, float *__restrict__ out,
                      const float *__restrict__ gate, q8split o) {
    extern __shared__ float4 fs[]; /* per head and block: ca, cb, l_b */
    const int64_t rh0 = (int64_t)blockIdx.x * HB;
    const mucu_attn_row a = merge_begin<0>(desc, rh0 / n_head);
    const int64_t nbr = a.pos >= a.first ? (a.pos - a.first) / 256 + 1 : 0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool mine = tid < HB * D; /* a (head, dim) of this CTA */
    const int hb = mine ? tid / (int)D : 0, d = tid % (int)D;
    const float *pr = part + (rh0 + hb) * nbmax * (D + 2);
    float4 *fh = fs + hb * nbmax;
    /* this thread's first values of the chain below, asked for before the scan */
    constexpr int U = 8;
    float L = 0.0f, A = 0.0f, cur[U], nxt[U], gv = 0.0f;
    if (mine) {
        if (GATE) gv = gate[rh0 * D + tid];
        if (nbr > 0) L = pr[1], A = pr[2 + d];
#pragma unroll
        for (int u = 0; u < U; u++) cur[u] = 1 + u < nbr ? pr[(1 + u) * (D + 2) + 2 + d] : 0.0f;
    }
    if (warp < HB) { /* warp w scans head w's blocks */
        const float *pw = part + (rh0 + warp) * nbmax * (D + 2);
        float4 *fw = fs + warp * nbmax;
        float carry = 0.0f; /* M after the blocks before this chunk */
        for (int64_t j0 = 0; j0 < nbr; j0 += 32) {
            const int64_t jl = j0 + lane;
            const bool ok = jl < nbr;
            const float mb = ok ? pw[jl * (D + 2)] : -INFINITY, lb = ok ? pw[jl * (D + 2) + 1] : 0.0f;
            float pm = mb; /* inclusive scan; of equal values the earlier block's wins */
            for (int off = 1; off < 32; off *= 2) {
                const float ov = __shfl_up_sync(FULL_MASK, pm, off);
                if (lane >= off && !(pm > ov)) pm = ov;
            }
            const float Mj = j0 == 0 ? pm : (pm > carry ? pm : carry);
            float Mp = __shfl_up_sync(FULL_MASK, Mj, 1);
            if (lane == 0) Mp = carry;
            if (ok) fw[jl] = make_float4(d_expf(Mp - Mj), d_expf(mb - Mj), lb, 0.0f);
            carry = __shfl_sync(FULL_MASK, Mj, 31);
        }
    }
    __syncthreads();
    if (mine) {
        for (int64_t j0 = 1; j0 < nbr; j0 += U) {
#pragma unroll
            for (int u = 0; u < U; u++) nxt[u] = j0 + U + u < nbr ? pr[(j0 + U + u) * (D + 2) + 2 + d] : 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++)
                if (j0 + u < nbr) {
                    const float4 f = fh[j0 + u];
                    L = L * f.x + f.z * f.y;
                    A = A * f.x + cur[u] * f.y;
                }
#pragma unroll
            for (int u = 0; u < U; u++) cur[u] = nxt[u];
        }
    }
    if (!GATE) {
        if (mine) out[rh0 * D + tid] = A / L;
        return;
    }
    const float v = (A / L) * d_sigmoidf(gv); /* every thread is mine: HB * D = blockDim.x = 256 */
    out[rh0 * D + tid] = v;
    if (!o.qs) return;
    __syncthreads(); /* the scan's values are read: fs holds the block now */
    float *stage = (float *)fs;
    stage[tid] = v;
    __syncthreads();
    if (warp == 0) {
        float w[8];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = stage[lane * 8 + i];
        quantize_block_warp(w, o, rh0 * D / 256, lane);
    }
}

extern "C" {
int mucu_attn_dec_hg = -1;
int mucu_attn_dec_kst = -1;
int mucu_attn_dec_cl = -1;
int mucu_attn_dec_fl = -1;
int mucu_attn_dec_fl_rows = -1;
int mucu_attn_bench_pass = 0;
}

static int dec_hg_forced(void) { return env_setting(&mucu_attn_dec_hg, "MUSER_CUDA_ATTN_HG", 0); }
/* MUSER_CUDA_ATTN_CL=N: k_attn_dcl for the calls that write partials over
 * N or more 256-key blocks (0, the default: never) and that k_attn_dfl does
 * not take (more than MUSER_CUDA_ATTN_FL_ROWS rows, below). It lost
 * wherever it was measured: 16 rows over 16k keys alone 528.54 us against
 * k_attn_dec's 306.75; 8 sequences at 16,384 with the cluster from 64
 * blocks 500.94 tokens/s against 546.20 on k_attn_dec (docs/benchmarks.md
 * "Switches and what they are worth"). */
static int dec_cl(void) { return env_setting(&mucu_attn_dec_cl, "MUSER_CUDA_ATTN_CL", 0); }
/* MUSER_CUDA_ATTN_FL=N: k_attn_dfl for the calls of at most MUSER_CUDA_ATTN_FL_ROWS rows that write
 * partials over N or more units (row, KV head, 256-key block; 0: never). The defaults, 96 units and 8 rows,
 * take the full layers of 1-8 sequences from 12,288 keys on (96 units with 2 KV heads at 1 row): there the
 * whole model decoded faster on it than on k_attn_dec or the cluster kernel (1 row at 16k and 64k; 4 and 8
 * sequences at 16k, where it is slower alone; 8 sequences 555.44 tokens/s against 546.20 on k_attn_dec;
 * docs/cuda.md "Decode attention", docs/benchmarks.md "Kernels alone"). 16 rows over 16k keys alone take
 * 367.04 us on it against 319.68 on k_attn_dec, so more than 8 rows stay there. */
static int dec_fl(void) { return env_setting(&mucu_attn_dec_fl, "MUSER_CUDA_ATTN_FL", 96); }
static int dec_fl_rows(void) { return env_setting(&mucu_attn_dec_fl_rows, "MUSER_CUDA_ATTN_FL_ROWS", 8); }
/* The settled keys' K staged before the wait (ad_begin); MUSER_CUDA_ATTN_KST=0 turns it off. */
static int dec_kst(void) { return env_setting(&mucu_attn_dec_kst, "MUSER_CUDA_ATTN_KST", 1); }

extern "C" bool mucu_attn_dec_takes(int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    const int k = mucu_attn_kernel_get();
    const int f = dec_hg_forced();
    return (k == 3 || (k == 1 && rows < 64)) && rows <= 65535 && n_head_kv > 0 && n_head % n_head_kv == 0 &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
           (f == 0 || ((f == 1 || f == 2 || f == 4 || f == 8 || f == 16) && (n_head / n_head_kv) % f == 0));
}

template <int DC, int HG, bool GATE>
static void launch_dec(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv, float scale,
                       const float *q, float *part, int64_t nbmax, float *final_out, const float *gate, q8split o,
                       cudaStream_t st) {
    typedef ad_cfg<DC, HG> C;
    static bool attr_set = false;
    if (!attr_set) {
        if (cudaFuncSetAttribute(k_attn_dec<DC, HG, GATE>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::TOTAL) !=
            cudaSuccess)
            return; /* the launch then fails, and the caller names it */
        attr_set = true;
    }
    const dim3 grid((unsigned)nbmax, (unsigned)(n_head_kv * (n_head / n_head_kv / HG)), (unsigned)rows);
    k_attn_dec<DC, HG, GATE><<<grid, AD_NT, C::TOTAL, st>>>(desc, n_head, n_head_kv, scale, q, part, nbmax, final_out,
                                                             gate, o, dec_kst());
}

template <int DC, bool GATE>
static void launch_dec_d(int hg, const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                         float scale, const float *q, float *part, int64_t nbmax, float *final_out, const float *gate,
                         q8split o, cudaStream_t st) {
#define AD_ARGS desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, gate, o, st
    switch (hg) {
    case 16: launch_dec<DC, 16, GATE>(AD_ARGS); break;
    case 8: launch_dec<DC, 8, GATE>(AD_ARGS); break;
    case 4: launch_dec<DC, 4, GATE>(AD_ARGS); break;
    case 2: launch_dec<DC, 2, GATE>(AD_ARGS); break;
    default: launch_dec<DC, 1, GATE>(AD_ARGS); break;
    }
#undef AD_ARGS
}

/* Heads per CTA: the most (the fewest conversions of each key) that still
 * give the grid AD_MIN_CTAS CTAs (about one per SM), else 1. From
 * test_cuda_backend --bench-attn-dec (H200): at one row over 2,048 keys 2 heads per CTA (128 CTAs)
 * beat 1 (256) by 9-13 %, over 16k keys 16 (128 CTAs) lose 2 % to 8
 * (256); the sliding layers, the common case, decide. A gated call of one
 * block (the output is final) takes at least 256 / head_dim heads, so that
 * each CTA owns whole Q8_K blocks of the gated output. */
#define AD_MIN_CTAS 120

template <int DC, int G>
static void launch_fl(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv, float scale,
                      const float *q, float *part, int64_t nbmax, cudaStream_t st) {
    static bool attr = false;
    if (!attr && cudaFuncSetAttribute(k_attn_dfl<DC, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      fl_cfg<DC, G>::TOTAL) == cudaSuccess)
        attr = true; /* (if not, the launch fails and the caller names it) */
    const int64_t units = rows * n_head_kv * nbmax, n = units < sm_count() ? units : sm_count();
    k_attn_dfl<DC, G><<<(unsigned)n, FL_NT, fl_cfg<DC, G>::TOTAL, st>>>(desc, rows, n_head, n_head_kv, scale, q, part,
                                                                         nbmax, dec_kst());
}

template <int DC>
static void launch_fl_g(int64_t G, const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                        float scale, const float *q, float *part, int64_t nbmax, cudaStream_t st) {
    if (G == 16) launch_fl<DC, 16>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, st);
    else if (G == 8) launch_fl<DC, 8>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, st);
    else if (G == 4) launch_fl<DC, 4>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, st);
    else launch_fl<DC, 2>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, st);
}

extern "C" bool mucu_attn_dec(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                              int64_t head_dim, float scale, const float *q, float *part, int64_t nbmax,
                              float *final_out, const float *gate, void *q8, void *stream) {
    const int64_t G = n_head / n_head_kv, base = nbmax * n_head_kv * rows;
    if (!final_out && dec_fl() > 0 && base >= dec_fl() && rows <= dec_fl_rows() && (head_dim == 64 || head_dim == 128) &&
        (G == 2 || G == 4 || G == 8 || G == 16)) {
        if (head_dim == 64) launch_fl_g<2>(G, desc, rows, n_head, n_head_kv, scale, q, part, nbmax, (cudaStream_t)stream);
        else launch_fl_g<4>(G, desc, rows, n_head, n_head_kv, scale, q, part, nbmax, (cudaStream_t)stream);
        return false;
    }
    if (!final_out && dec_cl() > 0 && nbmax >= dec_cl() && G <= 16 && 16 % G == 0 && nbmax * CL_N <= 0x7FFFFFFF) {
        const dim3 grid((unsigned)(nbmax * CL_N), (unsigned)n_head_kv, (unsigned)rows);
        const cudaStream_t st = (cudaStream_t)stream;
#define CL_LAUNCH(DC)                                                                                                  \
    do {                                                                                                               \
        static bool attr = false;                                                                                      \
        if (!attr && cudaFuncSetAttribute(k_attn_dcl<DC>, cudaFuncAttributeMaxDynamicSharedMemorySize,                 \
                                          cl_cfg<DC>::TOTAL) == cudaSuccess)                                           \
            attr = true;                                                                                               \
        k_attn_dcl<DC><<<grid, AD_NT, cl_cfg<DC>::TOTAL, st>>>(desc, n_head, n_head_kv, scale, q, part, nbmax);        \
    } while (0)
        if (head_dim == 64) CL_LAUNCH(2);
        else if (head_dim == 128) CL_LAUNCH(4);
        else CL_LAUNCH(8);
#undef CL_LAUNCH
        return false;
    }
    int hg = dec_hg_forced();
    if (hg == 0) {
        hg = 1;
        for (int c = 16; c > 1; c /= 2)
            if (G % c == 0 && base * (G / c) >= AD_MIN_CTAS) {
                hg = c;
                break;
            }
        if (gate && final_out && hg * head_dim < 256 && G % (256 / head_dim) == 0) hg = (int)(256 / head_dim);
    }
    const bool gated = gate && final_out && (hg * head_dim) % 256 == 0;
    const q8split o = gated && q8 ? q8split_at(q8, rows * n_head * head_dim, 1) : q8split{NULL, NULL, NULL};
    const cudaStream_t st = (cudaStream_t)stream;
#define AD_ARGS hg, desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, gated ? gate : NULL, o, st
    if (head_dim == 64) gated ? launch_dec_d<2, true>(AD_ARGS) : launch_dec_d<2, false>(AD_ARGS);
    else if (head_dim == 128) gated ? launch_dec_d<4, true>(AD_ARGS) : launch_dec_d<4, false>(AD_ARGS);
    else gated ? launch_dec_d<8, true>(AD_ARGS) : launch_dec_d<8, false>(AD_ARGS);
#undef AD_ARGS
    return gated;
}

extern "C" bool mucu_attn_merge_scan_takes(int64_t head_dim, int64_t nbmax) {
    const int k = mucu_attn_kernel_get();
    return k != 0 && k != 4 && head_dim <= 512 && nbmax * 16 <= 48 * 1024;
}

extern "C" bool mucu_attn_merge_scan(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t head_dim,
                                     const float *part, int64_t nbmax, float *out, const float *gate, void *q8,
                                     void *stream) {
    const cudaStream_t st = (cudaStream_t)stream;
    const int64_t hb = 256 / head_dim;
    if (gate && 256 % head_dim == 0 && head_dim >= 32 && n_head % hb == 0 && (size_t)(hb * nbmax) * 16 <= 48 * 1024) {
        const q8split o = q8 ? q8split_at(q8, rows * n_head * head_dim, 1) : q8split{NULL, NULL, NULL};
        const size_t sm = (size_t)(hb * nbmax) * 16 > 1024 ? (size_t)(hb * nbmax) * 16 : 1024;
        k_attn_merge_scan<true><<<(unsigned)(rows * n_head / hb), 256, sm, st>>>(desc, n_head, head_dim, (int)hb, part,
                                                                                  nbmax, out, gate, o);
        return true;
    }
    const unsigned threads = (unsigned)((head_dim + 31) / 32 * 32);
    k_attn_merge_scan<false><<<(unsigned)(rows * n_head), threads < 32 ? 32 : threads, (size_t)nbmax * 16, st>>>(
        desc, n_head, head_dim, 1, part, nbmax, out, NULL, q8split{NULL, NULL, NULL});
    return false;
}

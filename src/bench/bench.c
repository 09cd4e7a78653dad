/* The benchmark runner: load through the public API (so the backend is the
 * one users get), then time sessions exactly as muser run feeds them
 * (chunked prefill, last-row logits, finiteness check), and an engine of N
 * sessions decoding together (--parallel). */
#include "bench/bench.h"
#include "backend/cpu/cpu_backend.h"
#include "model/api_internal.h"
#include "sample/sample.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void mu_bench_opts_init(mu_bench_opts *o) {
    *o = (mu_bench_opts){.backend = MUSER_BACKEND_DEFAULT, .n_prompt = 512, .n_gen = 128, .reps = 5, .warmup = 1};
}

/* ---------- statistics ---------- */

void mu_bench_stats_compute(mu_bench_stats *s, const double *samples, int n) {
    memset(s, 0, sizeof *s);
    if (n <= 0) return;
    s->n = n;
    s->samples = mu_xmalloc((size_t)n * sizeof(double));
    memcpy(s->samples, samples, (size_t)n * sizeof(double));
    double *sorted = mu_xmalloc((size_t)n * sizeof(double));
    memcpy(sorted, samples, (size_t)n * sizeof(double));
    mu_sort_doubles(sorted, (size_t)n);
    s->min = sorted[0];
    s->max = sorted[n - 1];
    s->median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += samples[i];
    s->mean = sum / n;
    for (int i = 0; i < n; i++) sq += (samples[i] - s->mean) * (samples[i] - s->mean);
    s->cv = n > 1 && s->mean > 0 ? sqrt(sq / (n - 1)) / s->mean : 0.0;
    free(sorted);
}

/* ---------- the session under test ---------- */

/* Feed tokens in chunks through the session (as muser run does); the
 * session checks the last row's logits are finite. */
static bool session_feed(muser_session *s, const int32_t *tokens, int64_t n, mu_error *err) {
    return muser_session_feed(s, tokens, n, (muser_error *)err);
}

/* Synthetic depth: random K/V rows (normal-ish, fixed seed) for positions
 * [0, depth) of every layer, stored straight into the session's cache.
 * Attention cost does not depend on the values. */
static bool fill_synthetic(muser_session *s, mu_backend *be, int64_t depth, mu_error *err) {
    mu_kv_cache *kv = mu_session_kv(s);
    const int64_t row = kv->layers[0].row_elems;
    enum { POOL = 61 };
    float *pool = mu_xmalloc((size_t)(POOL * row) * sizeof(float));
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < POOL * row; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        pool[i] = (float)((double)(x >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    const size_t bytes = (size_t)(POOL * row) * sizeof(float);
    float *dev = mu_backend_xalloc(be, bytes, "the synthetic K/V rows");
    be->upload(be, dev, pool, bytes);
    bool ok = true;
    for (int il = 0; il < kv->n_layers && ok; il++)
        for (int64_t p = 0; p < depth && ok; p++)
            ok = mu_kv_append(kv, il, p, dev + (p % POOL) * row, dev + ((p * 7 + 3) % POOL) * row, err);
    be->free(be, dev, bytes);
    free(pool);
    if (ok) mu_session_set_pos(s, depth);
    return ok;
}

/* Deterministic token ids in [0, n_vocab). */
static void make_tokens(int32_t *t, int64_t n, int64_t n_vocab, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % (uint64_t)n_vocab);
    }
}

/* ---------- the runner ---------- */

typedef struct runner {
    const mu_bench_opts *o;
    muser_session *s;
    muser_snapshot *at_depth;
    int64_t depth;
    int32_t *tokens;
    mu_membw *pair;            /* opts.paired_membw_bytes */
    double weight_bytes;       /* weights read per decoded token */
} runner;

static void progress(const mu_bench_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(const mu_bench_opts *o, const char *fmt, ...) {
    if (!o->progress) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->progress_ctx, line);
}

static bool back_to_depth(runner *r, mu_error *err) {
    if (!r->at_depth) {
        muser_session_reset(r->s);
        return true;
    }
    return muser_session_restore(r->s, r->at_depth, (muser_error *)err);
}

void mu_bench_pause(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The greedy chain's next(): every pick is fed, and an undecided row's
 * first maximum (the pick's own rule); the chain's max_feed ends it. */
static int32_t chain_take(void *user, int32_t tok, const float *row) {
    return tok >= 0 ? tok : mu_sample_argmax(row, (size_t)*(const int64_t *)user, NULL, 0);
}

/* One timed run: prefill of n_prompt tokens, or n_gen single-token feeds
 * (or, with opts.chain, n_gen tokens of the greedy chain from the first). */
static bool timed_run(runner *r, bool decode, double *tok_s, mu_error *err) {
    if (!back_to_depth(r, err)) return false;
    const int64_t n = decode ? r->o->n_gen : r->o->n_prompt;
    const int32_t *t = r->tokens + (decode ? r->o->n_prompt : 0);
    double t0 = mu_now();
    if (decode && r->o->chain) {
        muser_model_info info;
        muser_model_get_info(muser_session_model(r->s), &info);
        int64_t V = info.n_vocab;
        if (muser_session_decode_chain(r->s, t[0], n, chain_take, &V, (muser_error *)err) < 0) return false;
    } else if (decode) {
        for (int64_t i = 0; i < n; i++)
            if (!session_feed(r->s, t + i, 1, err)) return false;
    } else if (!session_feed(r->s, t, n, err)) {
        return false;
    }
    double dt = mu_now() - t0;
    *tok_s = dt > 0 ? (double)n / dt : 0.0;
    return true;
}

/* The bandwidth pass paired with a decode repetition: after a pause long
 * enough for the pool's idle workers to stop spinning, the best of two
 * passes of each read loop over the kept buffer. */
static double paired_pass(runner *r) {
    mu_bench_pause(0.002);
    return mu_membw_measure(r->pair, 2);
}

/* Timed repetitions of one test; for decode with paired passes, also a
 * pass right before and right after each repetition, and the repetition's
 * weight GB/s as a share of the mean of those two. */
static bool run_test(runner *r, bool decode, mu_bench_depth *d, mu_error *err) {
    const mu_bench_opts *o = r->o;
    const char *what = decode ? "decode" : "prefill";
    const bool paired = decode && r->pair;
    double *samples = mu_xmalloc((size_t)(3 * o->reps + 1) * sizeof(double));
    double *share = samples + o->reps, *bw = share + o->reps; /* bw[rep], bw[rep + 1]: the passes around rep */
    bool ok = true;
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        double v = 0;
        const int rep = i - o->warmup;
        if (rep >= 0) mu_bench_pause(o->pause_s);
        if (rep == 0 && paired) bw[0] = paired_pass(r);
        ok = timed_run(r, decode, &v, err);
        if (!ok) break;
        if (rep < 0) {
            progress(o, "depth %lld: %s warm-up: %.2f tok/s", (long long)r->depth, what, v);
        } else if (paired) {
            bw[rep + 1] = paired_pass(r);
            const double around = 0.5 * (bw[rep] + bw[rep + 1]);
            samples[rep] = v;
            share[rep] = around > 0 ? 100.0 * v * r->weight_bytes / 1e9 / around : 0.0;
            progress(o, "depth %lld: %s %d/%d: %.2f tok/s, %.1f%% of the %.2f GB/s read around it (%.2f before, "
                     "%.2f after)", (long long)r->depth, what, rep + 1, o->reps, v, share[rep], around, bw[rep],
                     bw[rep + 1]);
        } else {
            samples[rep] = v;
            progress(o, "depth %lld: %s %d/%d: %.2f tok/s", (long long)r->depth, what, rep + 1, o->reps, v);
        }
    }
    if (ok) mu_bench_stats_compute(decode ? &d->decode : &d->prefill, samples, o->reps);
    if (ok && paired) {
        mu_bench_stats_compute(&d->paired_membw, bw, o->reps + 1);
        mu_bench_stats_compute(&d->paired_share, share, o->reps);
    }
    free(samples);
    return ok;
}

static bool run_depth(runner *r, const muser_model *mm, mu_bench_depth *d, mu_error *err) {
    const mu_bench_opts *o = r->o;
    const int64_t n_ctx = d->depth + (o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen) + 1;
    muser_session_params sp = {.n_ctx = n_ctx, .prefill_chunk = o->chunk}; /* 0: the backend's choice */
    r->s = muser_session_create((muser_model *)mm, &sp, (muser_error *)err);
    if (!r->s) return false;
    r->depth = d->depth;
    r->at_depth = NULL;
    bool ok = true;
    if (d->depth > 0) {
        progress(o, "depth %lld: filling the context (%s)", (long long)d->depth, o->prefill_depth ? "prefill" : "synthetic K/V");
        double t0 = mu_now();
        if (o->prefill_depth) {
            int32_t *fill = mu_xmalloc((size_t)d->depth * sizeof(int32_t));
            make_tokens(fill, d->depth, mm->m->cfg.n_vocab, 7);
            ok = session_feed(r->s, fill, d->depth, err);
            free(fill);
        } else {
            ok = fill_synthetic(r->s, mm->be, d->depth, err);
        }
        d->fill_seconds = mu_now() - t0;
        if (ok) {
            r->at_depth = muser_session_snapshot(r->s);
            if (!r->at_depth) {
                mu_err_set(err, "bench: out of memory for the depth-%lld snapshot", (long long)d->depth);
                ok = false;
            }
        }
    }
    if (ok && o->n_prompt > 0) ok = run_test(r, false, d, err);
    if (ok && o->n_gen > 0) ok = run_test(r, true, d, err);
    muser_snapshot_free(r->at_depth);
    r->at_depth = NULL;
    muser_session_free(r->s);
    return ok;
}

/* ---------- sequences decoding together ---------- */

#define PARALLEL_PROMPT 32

/* Sessions' state before a repetition (untimed): the first time, reset,
 * the first `depth` positions filled with synthetic K/V rows and its own
 * prompt prefilled after them; with a depth, that state is kept as a
 * snapshot (snap[i]) and later repetitions restore it, a copy of the KV
 * where the fill appends every row of every layer again (seconds at 16k). */
static bool parallel_prefill(muser_session **s, muser_snapshot **snap, int64_t n_seq, const muser_model *mm,
                             int64_t depth, mu_error *err) {
    int32_t prompt[PARALLEL_PROMPT];
    for (int64_t i = 0; i < n_seq; i++) {
        if (snap[i]) {
            if (!muser_session_restore(s[i], snap[i], (muser_error *)err)) return false;
            continue;
        }
        muser_session_reset(s[i]);
        if (depth > 0 && !fill_synthetic(s[i], mm->be, depth, err)) return false;
        make_tokens(prompt, PARALLEL_PROMPT, mm->m->cfg.n_vocab, 100 + (uint64_t)i);
        if (!muser_session_feed(s[i], prompt, PARALLEL_PROMPT, (muser_error *)err)) return false;
        if (depth > 0 && !(snap[i] = muser_session_snapshot(s[i]))) {
            mu_err_set(err, "bench: out of memory for the depth-%lld snapshot of sequence %lld", (long long)depth,
                       (long long)i);
            return false;
        }
    }
    return true;
}

/* Step t of a repetition: one forward of one row per sequence. */
static bool parallel_step(muser_engine *e, muser_session **s, int64_t n_seq, const int32_t *tokens, int64_t n_gen,
                          int64_t t, mu_error *err) {
    for (int64_t i = 0; i < n_seq; i++)
        if (!muser_session_submit(s[i], &tokens[(t + i * 7) % n_gen], 1, NULL, (muser_error *)err)) return false;
    muser_step_info info;
    if (muser_engine_step(e, &info, (muser_error *)err) != n_seq) {
        if (!err->msg[0]) mu_err_set(err, "bench: a parallel step completed %d of %lld sequences (%s)", info.completed,
                                     (long long)n_seq, muser_session_error(s[0]));
        return false;
    }
    return true;
}

/* One timed repetition: n_gen steps. */
static bool parallel_rep(muser_engine *e, muser_session **s, int64_t n_seq, const int32_t *tokens, int64_t n_gen,
                         double *tok_s, mu_error *err) {
    double t0 = mu_now();
    for (int64_t t = 0; t < n_gen; t++)
        if (!parallel_step(e, s, n_seq, tokens, n_gen, t, err)) return false;
    double dt = mu_now() - t0;
    *tok_s = dt > 0 ? (double)(n_seq * n_gen) / dt : 0.0;
    return true;
}

/* One engine of n_seq sessions. */
typedef struct par_engine {
    muser_engine *e;
    muser_session **s;
    muser_snapshot **snap; /* each session's state before a repetition (parallel_prefill) */
    int64_t n_seq;
    double *samples;
} par_engine;

static bool par_open(const mu_bench_opts *o, muser_model *mm, int64_t n_seq, int64_t n_gen, par_engine *pe,
                     mu_error *err) {
    muser_engine_params ep = {.n_seq_max = (int32_t)n_seq, .n_ctx = o->parallel_depth + PARALLEL_PROMPT + n_gen + 1,
                              .n_batch = o->chunk > 0 ? o->chunk : 512};
    if (ep.n_batch < n_seq) ep.n_batch = n_seq;
    *pe = (par_engine){.n_seq = n_seq};
    pe->e = muser_engine_create(mm, &ep, (muser_error *)err);
    if (!pe->e) return false;
    pe->s = mu_xcalloc((size_t)n_seq, sizeof *pe->s);
    pe->snap = mu_xcalloc((size_t)n_seq, sizeof *pe->snap);
    pe->samples = mu_xcalloc((size_t)o->reps, sizeof *pe->samples);
    for (int64_t i = 0; i < n_seq; i++)
        if (!(pe->s[i] = muser_engine_session(pe->e, (muser_error *)err))) return false;
    return true;
}

/* --interleave: one repetition of every count at once, their steps taking
 * turns (step t of every count, then step t + 1), each count's time the sum
 * of its own steps: a machine that slows down for seconds at a time (a
 * throttled VM) then weighs on every count alike, not on whichever count
 * happened to run then. tok_s[k] per count. */
static bool parallel_rep_interleaved(par_engine *pe, int n, const int32_t *tokens, int64_t n_gen, double *tok_s,
                                     mu_error *err) {
    double *busy = mu_xcalloc((size_t)n, sizeof *busy);
    bool ok = true;
    for (int64_t t = 0; t < n_gen && ok; t++)
        for (int k = 0; k < n && ok; k++) {
            const double t0 = mu_now();
            ok = parallel_step(pe[k].e, pe[k].s, pe[k].n_seq, tokens, n_gen, t, err);
            busy[k] += mu_now() - t0;
        }
    for (int k = 0; k < n && ok; k++) tok_s[k] = busy[k] > 0 ? (double)(pe[k].n_seq * n_gen) / busy[k] : 0.0;
    free(busy);
    return ok;
}

static void par_close(par_engine *pe) {
    for (int64_t i = 0; pe->snap && i < pe->n_seq; i++) muser_snapshot_free(pe->snap[i]);
    free(pe->snap);
    muser_engine_free(pe->e);
    free(pe->s);
    free(pe->samples);
}

/* Every sequence count in turn within each repetition, so a machine whose
 * bandwidth drifts over minutes weighs on all of them alike. */
static bool run_parallel(runner *r, muser_model *mm, mu_bench_result *res, mu_error *err) {
    const mu_bench_opts *o = r->o;
    const int64_t n_gen = o->n_gen > 0 ? o->n_gen : 128;
    const int n = res->n_parallel;
    par_engine *pe = mu_xcalloc((size_t)n, sizeof *pe);
    bool ok = true;
    for (int k = 0; k < n && ok; k++) ok = par_open(o, mm, res->parallel[k].n_seq, n_gen, &pe[k], err);
    double *v_all = mu_xcalloc((size_t)n, sizeof *v_all);
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        const int rep = i - o->warmup;
        if (o->interleave) {
            for (int k = 0; k < n && ok; k++) ok = parallel_prefill(pe[k].s, pe[k].snap, pe[k].n_seq, mm, o->parallel_depth, err);
            if (ok && rep >= 0) mu_bench_pause(o->pause_s);
            ok = ok && parallel_rep_interleaved(pe, n, r->tokens, n_gen, v_all, err);
        }
        for (int k = 0; k < n && ok; k++) {
            double v = v_all[k];
            if (!o->interleave) {
                ok = parallel_prefill(pe[k].s, pe[k].snap, pe[k].n_seq, mm, o->parallel_depth, err);
                if (ok && rep >= 0) mu_bench_pause(o->pause_s);
                ok = ok && parallel_rep(pe[k].e, pe[k].s, pe[k].n_seq, r->tokens, n_gen, &v, err);
            }
            if (!ok) break;
            if (rep < 0) {
                progress(o, "parallel %lld: warm-up: %.2f tok/s", (long long)pe[k].n_seq, v);
                continue;
            }
            pe[k].samples[rep] = v;
            progress(o, "parallel %lld: %d/%d: %.2f tok/s (%.2f per sequence)", (long long)pe[k].n_seq, rep + 1,
                     o->reps, v, v / (double)pe[k].n_seq);
        }
    }
    double *ratio = mu_xmalloc((size_t)o->reps * sizeof *ratio);
    for (int k = 0; k < n; k++) {
        if (ok) mu_bench_stats_compute(&res->parallel[k].aggregate, pe[k].samples, o->reps);
        if (ok && pe[0].n_seq == 1) {
            for (int i = 0; i < o->reps; i++) ratio[i] = pe[0].samples[i] > 0 ? pe[k].samples[i] / pe[0].samples[i] : 0;
            mu_bench_stats_compute(&res->parallel[k].ratio, ratio, o->reps);
        }
    }
    for (int k = 0; k < n; k++) par_close(&pe[k]);
    free(v_all);
    free(ratio);
    free(pe);
    return ok;
}

bool mu_bench_run(const mu_bench_opts *o, mu_bench_result *res, mu_error *err) {
    memset(res, 0, sizeof *res);
    if (o->reps < 1 || o->warmup < 0 || o->n_prompt < 0 || o->n_gen < 0 ||
        (o->n_prompt == 0 && o->n_gen == 0 && !o->n_parallel)) {
        mu_err_set(err, "bench: nothing to measure (reps %d, prompt %lld, gen %lld)", o->reps, (long long)o->n_prompt,
                   (long long)o->n_gen);
        return false;
    }
    static const int64_t zero_depth[1] = {0};
    const int64_t *depths = o->depths ? o->depths : zero_depth;
    const int n_depths = o->depths ? o->n_depths : 1;
    progress(o, "loading %s", o->model_path);
    double t0 = mu_now();
    muser_model_params mp = {.backend = o->backend, .n_threads = o->n_threads, .use_mlock = o->use_mlock};
    muser_model *mm = muser_model_load(o->model_path, &mp, (muser_error *)err);
    if (!mm) return false;
    res->load_seconds = mu_now() - t0;
    muser_model_get_info(mm, &res->info);
    snprintf(res->model_name, sizeof res->model_name, "%s", res->info.name ? res->info.name : "");
    snprintf(res->lane, sizeof res->lane, "%s", res->info.lane ? res->info.lane : "");
    snprintf(res->backend, sizeof res->backend, "%s", res->info.backend ? res->info.backend : "");
    snprintf(res->isa, sizeof res->isa, "%s", !strcmp(res->backend, "cpu") ? mu_cpu_isa_name(mu_backend_cpu_isa(mm->be)) : "-");
    res->info.name = res->info.lane = res->info.backend = res->info.architecture = NULL; /* owned by mm */
    res->n_threads = mm->be->n_threads;
    for (int i = 0; i < n_depths; i++)
        if (depths[i] < 0 || depths[i] > ((int64_t)1 << 24)) {
            mu_err_set(err, "bench: depth %lld out of range", (long long)depths[i]);
            muser_model_free(mm);
            return false;
        }
    res->depths = mu_xcalloc((size_t)n_depths, sizeof *res->depths);
    res->n_depths = n_depths;
    runner r = {.o = o, .weight_bytes = (double)res->info.weight_bytes_per_token};
    res->membw_gbs = o->membw_gbs;
    res->membw_of = o->membw_gbs > 0 ? "host" : "";
    if (o->membw_backend && mm->be->read_bandwidth) {
        /* the device's memory: 16 GiB as in tests/cuda/device.sh, less when that does not fit beside the model */
        for (size_t gib = 16; gib >= 1 && strcmp(res->membw_of, "device"); gib /= 4) {
            progress(o, "measuring the device's read bandwidth (%zu GiB)", gib);
            double gbs = 0;
            if (mm->be->read_bandwidth(mm->be, gib << 30, 5, &gbs) && gbs > 0) res->membw_gbs = gbs, res->membw_of = "device";
        }
    }
    if (o->paired_membw_bytes > 0 && o->n_gen > 0 && strcmp(res->membw_of, "device")) {
        progress(o, "allocating the paired bandwidth pass's %zu MiB buffer", o->paired_membw_bytes >> 20);
        r.pair = mu_membw_open(o->n_threads > 0 ? o->n_threads : res->n_threads, o->paired_membw_bytes);
        if (!r.pair) {
            mu_err_set(err, "bench: cannot allocate the %zu-byte buffer of the paired bandwidth pass",
                       o->paired_membw_bytes);
            mu_bench_result_free(res);
            muser_model_free(mm);
            return false;
        }
    }
    const int64_t n_tokens = o->n_prompt + (o->n_gen > 0 ? o->n_gen : 128) + 1;
    r.tokens = mu_xmalloc((size_t)n_tokens * sizeof(int32_t));
    make_tokens(r.tokens, n_tokens, mm->m->cfg.n_vocab, 1);
    bool ok = true;
    for (int i = 0; i < n_depths && ok && (o->n_prompt > 0 || o->n_gen > 0); i++) {
        res->depths[i].depth = depths[i];
        ok = run_depth(&r, mm, &res->depths[i], err);
    }
    if (ok && o->n_parallel) {
        res->parallel = mu_xcalloc((size_t)o->n_parallel, sizeof *res->parallel);
        res->n_parallel = o->n_parallel;
        if (o->parallel_depth < 0 || o->parallel_depth > ((int64_t)1 << 24)) {
            mu_err_set(err, "bench: --parallel-depth %lld out of range", (long long)o->parallel_depth);
            ok = false;
        }
        for (int i = 0; i < o->n_parallel && ok; i++) {
            res->parallel[i].n_seq = o->parallel[i];
            if (o->parallel[i] < 1 || o->parallel[i] > 4096) {
                mu_err_set(err, "bench: --parallel %lld out of range [1, 4096]", (long long)o->parallel[i]);
                ok = false;
            }
        }
        if (ok)
            progress(o, o->interleave ? "parallel: sequences decoding together, the counts' steps taking turns"
                                      : "parallel: sequences decoding together, counts alternating within each repetition");
        ok = ok && run_parallel(&r, mm, res, err);
    }
    if (ok && o->draft_path) {
        progress(o, "speculative: greedy generation, plain vs %s", o->draft_path);
        ok = mu_bench_spec_run(o, mm, &res->spec, err);
    }
    free(r.tokens);
    mu_membw_close(r.pair);
    muser_model_free(mm);
    if (!ok) mu_bench_result_free(res);
    return ok;
}

void mu_bench_result_free(mu_bench_result *r) {
    for (int i = 0; i < r->n_depths; i++) {
        free(r->depths[i].prefill.samples);
        free(r->depths[i].decode.samples);
        free(r->depths[i].paired_membw.samples);
        free(r->depths[i].paired_share.samples);
    }
    free(r->depths);
    r->depths = NULL;
    r->n_depths = 0;
    free(r->spec.plain.samples);
    free(r->spec.spec.samples);
    for (int i = 0; i < r->n_parallel; i++) {
        free(r->parallel[i].aggregate.samples);
        free(r->parallel[i].ratio.samples);
    }
    free(r->parallel);
    r->parallel = NULL;
    r->n_parallel = 0;
    r->spec = (mu_bench_spec){0};
}

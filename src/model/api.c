/* The public embedding API (include/muser.h) over model, backend and KV. */
#include "model/api_internal.h"
#include "model/capture.h"
#include "backend/cpu/cpu_backend.h"
#include "model/repack.h"
#include <math.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

_Static_assert(sizeof(muser_error) == sizeof(mu_error), "error structs must match");

struct muser_session {
    muser_model *model;
    mu_kv_cache kv;
    mu_forward_scratch scratch;
    double *inv_freq;
    int64_t n_ctx, chunk, pos;
    float *logits;              /* [n_vocab], last row */
    bool has_logits;
    bool poisoned;              /* a non-finite logit was produced */
    mu_capture capture;         /* capture.n == 0: off (model/capture.h) */
    int64_t captured_rows;      /* rows of the last feed held in capture.rows */
};

struct muser_snapshot {
    mu_kv_snapshot *kv;
    int64_t pos;
};

bool muser_backend_from_name(const char *name, muser_backend_kind *out) {
    static const struct { const char *name; muser_backend_kind kind; } names[] = {
        {"auto", MUSER_BACKEND_DEFAULT}, {"ref", MUSER_BACKEND_REF},
        {"cpu", MUSER_BACKEND_CPU}, {"cuda", MUSER_BACKEND_CUDA},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(name, names[i].name)) { *out = names[i].kind; return true; }
    return false;
}

static mu_backend *create_backend(muser_backend_kind kind, int n_threads, mu_error *err) {
    switch (kind) { /* n_threads <= 0: each backend picks its default */
    case MUSER_BACKEND_REF:
        return mu_backend_ref_create(n_threads);
    case MUSER_BACKEND_DEFAULT: /* no GPU backend yet: the fast CPU backend */
    case MUSER_BACKEND_CPU:
        return mu_backend_cpu_create(n_threads);
    case MUSER_BACKEND_CUDA:
        mu_err_set(err, "backend 'cuda' is not available in this build (configure with -DMUSER_CUDA=ON)");
        return NULL;
    }
    mu_err_set(err, "unknown backend id %d", (int)kind);
    return NULL;
}

muser_model *muser_model_load(const char *path, const muser_model_params *params, muser_error *err) {
    muser_model_params p = params ? *params : (muser_model_params){0};
    mu_backend *be = create_backend(p.backend, p.n_threads, ERR(err));
    if (!be) return NULL;
    mu_model *m = mu_model_load(path, ERR(err));
    if (!m) {
        be->destroy(be);
        return NULL;
    }
    muser_model *mm = mu_xcalloc(1, sizeof *mm);
    mm->m = m;
    mm->be = be;
    mu_model_repack(m, be); /* the backend's load-time layouts (before mlock: those pages are the ones kept) */
    pthread_mutex_init(&mm->gvocab_lock, NULL);
    /* Locked pages cannot be paged out under memory pressure (or by
     * proactive reclaim), so every token reads them from RAM. */
    if (p.use_mlock && mlock(m->gguf->base, (size_t)m->gguf->size) != 0) {
        mu_err_set(ERR(err), "%s: mlock of %llu bytes failed: %s (raise RLIMIT_MEMLOCK, e.g. ulimit -l, or drop --mlock)",
                   path, (unsigned long long)m->gguf->size, strerror(errno));
        muser_model_free(mm);
        return NULL;
    }
    mm->locked = p.use_mlock;
    if (!mu_api_load_text(mm, ERR(err))) {
        muser_model_free(mm);
        return NULL;
    }
    return mm;
}

void muser_model_free(muser_model *m) {
    if (!m) return;
    if (m->locked) munlock(m->m->gguf->base, (size_t)m->m->gguf->size);
    mu_grammar_vocab_free(m->gvocab);
    pthread_mutex_destroy(&m->gvocab_lock);
    mu_api_free_text(m);
    m->be->destroy(m->be);
    mu_model_free(m->m);
    free(m);
}

void muser_model_get_info(const muser_model *mm, muser_model_info *info) {
    const mu_model *m = mm->m;
    const mu_model_config *c = &m->cfg;
    *info = (muser_model_info){
        .architecture = "muse-glimmer", .name = m->name, .lane = m->lane, .backend = mm->be->name,
        .n_layer = c->n_layer, .n_embd = c->n_embd, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim, .n_ff = c->n_ff, .n_vocab = c->n_vocab, .n_ctx_train = c->n_ctx_train,
        .sliding_window = c->sliding_window, .n_swa_layers = c->n_swa_layers,
        .file_bytes = m->gguf->size, .weight_bytes_per_token = m->weight_bytes,
    };
}

muser_session *muser_session_create(muser_model *mm, const muser_session_params *params, muser_error *err) {
    muser_session_params p = params ? *params : (muser_session_params){0};
    const mu_model_config *c = &mm->m->cfg;
    int64_t n_ctx = p.n_ctx > 0 ? p.n_ctx : c->n_ctx_train;
    int64_t chunk = p.prefill_chunk > 0 ? p.prefill_chunk : 512;
    if (p.n_ctx < 0 || p.prefill_chunk < 0 || n_ctx > (int64_t)1 << 24 || chunk > 65536) {
        mu_err_set(ERR(err), "session parameters out of range (n_ctx %lld, prefill_chunk %lld)",
                   (long long)p.n_ctx, (long long)p.prefill_chunk);
        return NULL;
    }
    if (chunk > n_ctx) chunk = n_ctx;
    muser_session *s = mu_xcalloc(1, sizeof *s);
    if (!mu_kv_init(&s->kv, (int)c->n_layer, c->is_swa, c->sliding_window, n_ctx,
                    c->n_head_kv, c->head_dim, ERR(err))) {
        free(s);
        return NULL;
    }
    s->model = mm;
    s->n_ctx = n_ctx;
    s->chunk = chunk;
    mu_scratch_init(&s->scratch, c, chunk);
    s->inv_freq = mu_rope_inv_freq(c);
    s->logits = mu_xmalloc((size_t)c->n_vocab * sizeof(float));
    return s;
}

void muser_session_free(muser_session *s) {
    if (!s) return;
    mu_kv_free(&s->kv);
    mu_scratch_free(&s->scratch);
    free(s->inv_freq);
    free(s->logits);
    free(s->capture.slot);
    free(s->capture.rows);
    free(s);
}

void muser_session_reset(muser_session *s) {
    mu_kv_clear(&s->kv);
    s->pos = 0;
    s->has_logits = false;
    s->poisoned = false;
    s->captured_rows = 0;
}

int64_t muser_session_pos(const muser_session *s) { return s->pos; }
int64_t muser_session_n_ctx(const muser_session *s) { return s->n_ctx; }
const float *muser_session_logits(const muser_session *s) { return s->has_logits ? s->logits : NULL; }

static bool check_feed(const muser_session *s, const int32_t *tokens, int64_t n, mu_error *err) {
    const int64_t n_vocab = s->model->m->cfg.n_vocab;
    if (s->poisoned) {
        mu_err_set(err, "session is poisoned by an earlier non-finite logit; reset it");
        return false;
    }
    if (n <= 0 || !tokens) {
        mu_err_set(err, "feed needs at least one token");
        return false;
    }
    if (n > s->n_ctx - s->pos) {
        mu_err_set(err, "context full: position %lld + %lld tokens exceeds n_ctx %lld",
                   (long long)s->pos, (long long)n, (long long)s->n_ctx);
        return false;
    }
    if (s->kv.ckpt_active && s->pos + n > s->kv.ckpt_pos + MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "checkpoint at position %lld allows %d rows; feeding %lld at %lld would exceed it (commit first)",
                   (long long)s->kv.ckpt_pos, MU_KV_MAX_ROLLBACK, (long long)n, (long long)s->pos);
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            mu_err_set(err, "token %lld (index %lld) is outside the vocabulary [0, %lld)",
                       (long long)tokens[i], (long long)i, (long long)n_vocab);
            return false;
        }
    return true;
}

static bool check_finite(muser_session *s, const float *logits, int64_t rows, mu_error *err) {
    const int64_t V = s->model->m->cfg.n_vocab;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < V; i++)
            if (!isfinite(logits[r * V + i])) {
                s->poisoned = true;
                mu_err_set(err, "non-finite logit %g for token %lld at position %lld (refusing to sample)",
                           (double)logits[r * V + i], (long long)i, (long long)(s->pos - rows + r));
                return false;
            }
    return true;
}

/* all_out == NULL: logits of the last row only, into s->logits. */
static bool feed(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, mu_error *err) {
    if (!check_feed(s, tokens, n, err)) return false;
    const mu_model *m = s->model->m;
    const int64_t V = m->cfg.n_vocab;
    s->has_logits = false;
    mu_capture *cap = s->capture.n ? &s->capture : NULL;
    s->captured_rows = 0;
    if (cap && cap->cap < n) {
        cap->rows = mu_xrealloc(cap->rows, (size_t)n * (size_t)(cap->n * m->cfg.n_embd) * sizeof(float));
        cap->cap = n;
    }
    for (int64_t done = 0; done < n;) {
        int64_t rows = n - done < s->chunk ? n - done : s->chunk;
        bool last = done + rows == n;
        float *out = all_out ? all_out + done * V : last ? s->logits : NULL;
        int64_t n_logits = all_out ? rows : 1;
        if (!mu_forward_capture(m, s->model->be, &s->kv, &s->scratch, s->inv_freq, tokens + done, rows, s->pos,
                                out, n_logits, cap, done, err)) {
            s->poisoned = true;
            return false;
        }
        s->pos += rows;
        if (cap) s->captured_rows = done + rows;
        if (out && !check_finite(s, out, n_logits, err)) return false;
        done += rows;
    }
    if (all_out) memcpy(s->logits, all_out + (n - 1) * V, (size_t)V * sizeof(float));
    s->has_logits = true;
    return true;
}

bool muser_session_feed(muser_session *s, const int32_t *tokens, int64_t n, muser_error *err) {
    return feed(s, tokens, n, NULL, ERR(err));
}

bool muser_session_feed_all(muser_session *s, const int32_t *tokens, int64_t n, float *out, muser_error *err) {
    if (!out) {
        mu_err_set(ERR(err), "feed_all needs an output buffer");
        return false;
    }
    return feed(s, tokens, n, out, ERR(err));
}

bool muser_session_checkpoint(muser_session *s, muser_error *err) {
    return mu_kv_checkpoint(&s->kv, ERR(err));
}

bool muser_session_rollback(muser_session *s, int64_t pos, muser_error *err) {
    if (!mu_kv_rollback(&s->kv, pos, ERR(err))) return false;
    s->pos = pos;
    s->has_logits = false;
    return true;
}

void muser_session_commit(muser_session *s) { mu_kv_commit(&s->kv); }

muser_model *muser_session_model(const muser_session *s) { return s->model; }

bool mu_session_set_capture(muser_session *s, const int *boundaries, int n, mu_error *err) {
    const int64_t n_layer = s->model->m->cfg.n_layer;
    if (n < 0 || n > n_layer + 1) {
        mu_err_set(err, "capture: %d boundaries requested; the model has %lld", n, (long long)n_layer + 1);
        return false;
    }
    int *slot = mu_xmalloc((size_t)(n_layer + 1) * sizeof *slot);
    for (int64_t b = 0; b <= n_layer; b++) slot[b] = -1;
    for (int i = 0; i < n; i++) {
        int b = boundaries[i];
        if (b < 0 || b > n_layer || slot[b] >= 0) {
            mu_err_set(err, "capture: boundary %d (entry %d) is %s", b, i,
                       b < 0 || b > n_layer ? "outside [0, n_layer]" : "repeated");
            free(slot);
            return false;
        }
        slot[b] = i;
    }
    free(s->capture.slot);
    free(s->capture.rows);
    s->capture = (mu_capture){.n = n, .slot = n ? slot : NULL};
    if (!n) free(slot);
    s->captured_rows = 0;
    return true;
}

const float *mu_session_captured(const muser_session *s, int64_t *n_rows) {
    *n_rows = s->capture.n ? s->captured_rows : 0;
    return *n_rows ? s->capture.rows : NULL;
}

muser_snapshot *muser_session_snapshot(const muser_session *s) {
    muser_snapshot *snap = mu_xcalloc(1, sizeof *snap);
    snap->kv = mu_kv_snapshot_take(&s->kv);
    snap->pos = s->pos;
    return snap;
}

bool muser_session_restore(muser_session *s, const muser_snapshot *snap, muser_error *err) {
    if (!mu_kv_snapshot_restore(&s->kv, snap->kv, ERR(err))) return false;
    s->pos = snap->pos;
    s->has_logits = false;
    s->poisoned = false;
    return true;
}

void muser_snapshot_free(muser_snapshot *snap) {
    if (!snap) return;
    mu_kv_snapshot_free(snap->kv);
    free(snap);
}

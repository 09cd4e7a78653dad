/* Engines and sessions (include/muser.h): a pool of sequences whose rows
 * run through the model together. The engine owns the backend memory all
 * its sessions share (scratch sized by n_batch, logits rows, capture rows)
 * and one lock; each session owns its KV cache and a host copy of its last
 * logits row. Two ways in:
 *   - feed / feed_all: this session's rows alone, now, in chunks;
 *   - submit + muser_engine_step: queued input of every session, one
 *     batched forward per step (decode and verification rows first, then
 *     prompt chunks), as a server drives it.
 * Both build an mu_batch and call mu_forward; since every row's bits are
 * independent of the rows around it (model/forward.c), a session's logits
 * do not depend on which way or with whom it ran. */
#include "model/api_internal.h"
#include "model/capture.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STEP_DECODE_MAX 16  /* queued rows that count as decode / verification, not prompt */
#define CHAIN_AHEAD 3       /* decode_chain's forwards in flight (at most the ring's slack + 2, kv.h) */
#define MAX_SEQ 4096

struct muser_engine {
    muser_model *model;
    mu_backend *be;
    int64_t n_ctx, n_batch, chunk;
    bool chunk_by_depth;        /* the backend's preferred chunk: capped by depth (mu_prompt_rows) */
    int64_t prefill_budget;     /* prompt rows beside decode rows; 0 = unbounded */
    int32_t n_seq_max;
    muser_session **seqs;       /* [n_seq_max], NULL = free */
    mu_kv_cache **kvs;          /* [n_seq_max]: the forward's view of seqs[i]->kv */
    mu_forward_scratch scratch;
    double *inv_freq;
    float *logits;              /* backend [n_logits][n_vocab] */
    int64_t n_logits;           /* logits rows one forward can return */
    mu_capture capture;         /* boundaries (slot) shared by sessions with capture on; rows: backend [n_batch] */
    int n_capturing;            /* sessions with capture on */
    uint64_t submit_clock;      /* orders submissions (oldest prompt first) */
    pthread_mutex_t lock;
    /* the batch under construction (host) */
    int32_t *b_token, *b_seq;
    int64_t *b_pos, *b_cap;
    bool *b_logits;
    int32_t *b_sessions;        /* sessions in the batch, in row order */
    bool b_is_tree;             /* the batch is one token tree (mu_session_feed_tree) */
    int64_t b_tpos[MU_TREE_MAX];
    mu_attn_tree b_tree[MU_TREE_MAX];
};

struct muser_session {
    muser_engine *e;
    int32_t id;
    bool owns_engine;           /* made by muser_session_create */
    mu_kv_cache kv;
    int64_t pos;
    float *logits;              /* host [n_vocab], last row */
    bool logits_backend;        /* logits came from the backend's host_alloc */
    bool has_logits;
    /* >= 0: the last row is vrows' row lazy_row, not yet downloaded into
     * logits (mu_session_defer_row); every reader goes through settle() */
    int64_t lazy_row;
    /* the tokens at positions [0, n_hist): what a durable pack records
     * (src/kvpack/); n_hist < pos when rows came from elsewhere (the
     * benchmark's synthetic depth) */
    int32_t *hist;
    int64_t n_hist, hist_cap;
    bool poisoned;
    char error[1024];
    /* capture (model/capture.h): rows of the most recent feed, backend [cap_cap][n * n_embd] */
    bool capture_on;
    float *cap_rows;
    int64_t cap_cap, captured_rows;
    /* queued input (submit) */
    int32_t *q;
    int64_t q_len, q_done, q_cap;
    float *q_all_out;
    uint64_t q_order;
    bool q_prompt;              /* submitted as a prompt: chunked and budgeted at any length */
    int32_t *chain_slots;       /* decode_chain's picks: [CHAIN_AHEAD][2], backend host memory */
    float *vrows;               /* feed_picks' logits rows, backend [16][n_vocab] (capture.h) */
    muser_spec *spec;           /* the speculation state bound to it (src/spec), whose assistant
                                 * context a durable pack carries too (docs/kvpack.md) */
};

struct muser_snapshot {
    mu_kv_snapshot *kv;
    int64_t pos;
    float *logits;              /* the last row, NULL when the session had none */
    int32_t *hist;              /* the known tokens [0, n_hist) */
    int64_t n_hist;
};

/* ------------------------------------------------------------------ engine */

static void lock(muser_engine *e) { pthread_mutex_lock(&e->lock); }
static void unlock(muser_engine *e) { pthread_mutex_unlock(&e->lock); }

muser_engine *muser_engine_create(muser_model *mm, const muser_engine_params *params, muser_error *err) {
    muser_engine_params p = params ? *params : (muser_engine_params){0};
    const mu_model_config *c = &mm->m->cfg;
    const int64_t n_ctx = p.n_ctx > 0 ? p.n_ctx : c->n_ctx_train;
    int64_t n_batch = p.n_batch > 0 ? p.n_batch : 512;
    const int32_t n_seq = p.n_seq_max > 0 ? p.n_seq_max : 1;
    if (p.n_ctx < 0 || n_ctx > (int64_t)1 << 24) {
        mu_err_set(ERR(err), "engine: n_ctx %lld out of range [1, 2^24]", (long long)p.n_ctx);
        return NULL;
    }
    if (p.n_batch < 0 || n_batch > 65536) {
        mu_err_set(ERR(err), "engine: n_batch %lld out of range [1, 65536]", (long long)p.n_batch);
        return NULL;
    }
    if (p.n_seq_max < 0 || n_seq > MAX_SEQ) {
        mu_err_set(ERR(err), "engine: n_seq_max %d out of range [1, %d]", p.n_seq_max, MAX_SEQ);
        return NULL;
    }
    if (p.prefill_chunk < 0 || p.prefill_chunk > n_batch) {
        mu_err_set(ERR(err), "engine: prefill_chunk %lld out of range [1, n_batch %lld]", (long long)p.prefill_chunk,
                   (long long)n_batch);
        return NULL;
    }
    if (p.prefill_budget < 0 || p.prefill_budget > n_batch) {
        mu_err_set(ERR(err), "engine: prefill_budget %lld out of range [0, n_batch %lld]", (long long)p.prefill_budget,
                   (long long)n_batch);
        return NULL;
    }
    int64_t chunk = p.prefill_chunk > 0 ? p.prefill_chunk : n_batch;
    if (chunk > n_ctx) chunk = n_ctx;
    muser_engine *e = mu_xcalloc(1, sizeof *e);
    e->model = mm;
    e->be = mm->be;
    e->n_ctx = n_ctx;
    e->n_seq_max = n_seq;
    e->chunk = chunk;
    e->prefill_budget = p.prefill_budget;
    /* room for a decode or verification block of every session at once */
    if (n_batch < chunk) n_batch = chunk;
    e->n_batch = n_batch;
    e->seqs = mu_xcalloc((size_t)n_seq, sizeof *e->seqs);
    e->kvs = mu_xcalloc((size_t)n_seq, sizeof *e->kvs);
    mu_scratch_init(&e->scratch, e->be, c, n_batch);
    e->inv_freq = mu_rope_inv_freq(c);
    /* Logits rows: a verification block per session, at least 64, at most a batch. */
    int64_t nl = (int64_t)n_seq * STEP_DECODE_MAX;
    e->n_logits = nl < 64 ? 64 : nl;
    if (e->n_logits > n_batch) e->n_logits = n_batch;
    e->logits = mu_backend_xalloc(e->be, (size_t)(e->n_logits * c->n_vocab) * sizeof(float), "logits rows");
    e->b_token = mu_xmalloc((size_t)n_batch * sizeof *e->b_token);
    e->b_seq = mu_xmalloc((size_t)n_batch * sizeof *e->b_seq);
    e->b_pos = mu_xmalloc((size_t)n_batch * sizeof *e->b_pos);
    e->b_cap = mu_xmalloc((size_t)n_batch * sizeof *e->b_cap);
    e->b_logits = mu_xmalloc((size_t)n_batch * sizeof *e->b_logits);
    e->b_sessions = mu_xmalloc((size_t)n_seq * sizeof *e->b_sessions);
    /* recursive: a speculative round holds it across its own engine calls (mu_session_lock) */
    pthread_mutexattr_t at;
    pthread_mutexattr_init(&at);
    pthread_mutexattr_settype(&at, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&e->lock, &at);
    pthread_mutexattr_destroy(&at);
    return e;
}

static void session_destroy(muser_session *s);

void muser_engine_free(muser_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->n_seq_max; i++)
        if (e->seqs[i]) session_destroy(e->seqs[i]);
    const mu_model_config *c = &e->model->m->cfg;
    mu_scratch_free(&e->scratch);
    e->be->free(e->be, e->logits, (size_t)(e->n_logits * c->n_vocab) * sizeof(float));
    if (e->capture.rows) e->be->free(e->be, e->capture.rows, (size_t)(e->n_batch * e->capture.n * c->n_embd) * sizeof(float));
    free(e->capture.slot);
    free(e->inv_freq);
    free(e->seqs);
    free(e->kvs);
    free(e->b_token);
    free(e->b_seq);
    free(e->b_pos);
    free(e->b_cap);
    free(e->b_logits);
    free(e->b_sessions);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* A session's logits row, in host memory the backend downloads straight
 * into where it has such (backend.h host_alloc: no staging copy). */
static void logits_alloc(muser_engine *e, muser_session *s) {
    const size_t bytes = (size_t)e->model->m->cfg.n_vocab * sizeof(float);
    s->logits = e->be->host_alloc ? e->be->host_alloc(e->be, bytes) : NULL;
    s->logits_backend = s->logits != NULL;
    if (!s->logits) s->logits = mu_xmalloc(bytes);
}

static void logits_free(muser_engine *e, muser_session *s) {
    if (s->logits_backend) e->be->host_free(e->be, s->logits, (size_t)e->model->m->cfg.n_vocab * sizeof(float));
    else free(s->logits);
}

muser_session *muser_engine_session(muser_engine *e, muser_error *err) {
    lock(e);
    int32_t id = 0;
    while (id < e->n_seq_max && e->seqs[id]) id++;
    if (id == e->n_seq_max) {
        unlock(e);
        mu_err_set(ERR(err), "engine: all %d sessions are in use", e->n_seq_max);
        return NULL;
    }
    const mu_model_config *c = &e->model->m->cfg;
    muser_session *s = mu_xcalloc(1, sizeof *s);
    s->lazy_row = -1;
    /* A ring keeps the window of the first row of the largest block one
     * forward stores for one session (kv.h). */
    const int64_t most = e->chunk > STEP_DECODE_MAX ? e->chunk : STEP_DECODE_MAX;
    if (!mu_kv_init(&s->kv, e->be, (int)c->n_layer, c->is_swa, c->sliding_window, most - 1, e->n_ctx,
                    c->n_head_kv, c->head_dim, ERR(err))) {
        unlock(e);
        free(s);
        return NULL;
    }
    s->e = e;
    s->id = id;
    logits_alloc(e, s);
    e->seqs[id] = s;
    e->kvs[id] = &s->kv;
    unlock(e);
    return s;
}

int32_t muser_engine_busy(muser_engine *e) {
    lock(e);
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_seq_max; i++) n += e->seqs[i] && e->seqs[i]->q_done < e->seqs[i]->q_len;
    unlock(e);
    return n;
}

/* Rows of a prompt chunk that starts at position pos, when the session
 * took the backend's preferred chunk (n rows, more than 512): as many as
 * keep rows x 256-key blocks of the chunk's attention within what 512-row
 * chunks reach at the end of an n_ctx context (and at least what a
 * 2,048-row chunk at 8,192 keys takes), never fewer than 512. The CUDA
 * prefill attention keeps a partial (maximum, sum, head_dim sums) per row,
 * head and block (docs/cuda.md "Not done"): at 131,072 keys a 2,048-row
 * chunk would take 4x the memory of a 512-row one, while near the start of
 * a context the larger chunk prefills about 1.1x faster. */
int64_t mu_prompt_rows(int64_t n, int64_t pos, int64_t n_ctx) {
    const int64_t blocks = (n_ctx + 255) / 256, floor_budget = 2048 * 32;
    const int64_t budget = 512 * blocks > floor_budget ? 512 * blocks : floor_budget;
    while (n > 512 && n * ((pos + n + 255) / 256) > budget) n = n - 256 > 512 ? n - 256 : 512;
    return n;
}

/* ------------------------------------------------------------------ sessions */

muser_session *muser_session_create(muser_model *mm, const muser_session_params *params, muser_error *err) {
    muser_session_params p = params ? *params : (muser_session_params){0};
    if (p.n_ctx < 0 || p.prefill_chunk < 0 || p.n_ctx > (int64_t)1 << 24 || p.prefill_chunk > 65536) {
        mu_err_set(ERR(err), "session parameters out of range (n_ctx %lld, prefill_chunk %lld)",
                   (long long)p.n_ctx, (long long)p.prefill_chunk);
        return NULL;
    }
    const int64_t n_ctx = p.n_ctx > 0 ? p.n_ctx : mm->m->cfg.n_ctx_train;
    /* no chunk asked for: the backend's preferred rows (CUDA: 2,048), capped by depth (mu_prompt_rows) */
    const int64_t pref = mm->be->prefill_rows > 512 ? mm->be->prefill_rows : 512;
    int64_t chunk = p.prefill_chunk > 0 ? p.prefill_chunk : pref;
    if (chunk > n_ctx) chunk = n_ctx;
    muser_engine_params ep = {.n_seq_max = 1, .n_ctx = n_ctx, .n_batch = chunk};
    muser_engine *e = muser_engine_create(mm, &ep, err);
    if (e) e->chunk_by_depth = p.prefill_chunk == 0 && chunk > 512;
    muser_session *s = e ? muser_engine_session(e, err) : NULL;
    if (!s) {
        muser_engine_free(e);
        return NULL;
    }
    s->owns_engine = true;
    return s;
}

static void session_destroy(muser_session *s) {
    muser_engine *e = s->e;
    const size_t row = (size_t)(e->capture.n * e->model->m->cfg.n_embd) * sizeof(float);
    if (s->cap_rows) e->be->free(e->be, s->cap_rows, (size_t)s->cap_cap * row);
    if (s->capture_on) e->n_capturing--;
    e->seqs[s->id] = NULL;
    e->kvs[s->id] = NULL;
    mu_kv_free(&s->kv);
    logits_free(e, s);
    if (s->chain_slots) {
        if (e->be->host_free) e->be->host_free(e->be, s->chain_slots, CHAIN_AHEAD * 2 * sizeof(int32_t));
        else free(s->chain_slots);
    }
    if (s->vrows) e->be->free(e->be, s->vrows, (size_t)(16 * e->model->m->cfg.n_vocab) * sizeof(float));
    free(s->hist);
    free(s->q);
    free(s);
}

void muser_session_free(muser_session *s) {
    if (!s) return;
    muser_engine *e = s->e;
    const bool owns = s->owns_engine;
    lock(e);
    session_destroy(s);
    unlock(e);
    if (owns) muser_engine_free(e);
}

static void reset_locked(muser_session *s) {
    mu_kv_clear(&s->kv);
    s->pos = 0;
    s->n_hist = 0;
    s->has_logits = false;
    s->poisoned = false;
    s->error[0] = 0;
    s->captured_rows = 0;
    s->q_len = s->q_done = 0;
    s->q_all_out = NULL;
}

void muser_session_reset(muser_session *s) {
    lock(s->e);
    reset_locked(s);
    unlock(s->e);
}

int64_t muser_session_pos(const muser_session *s) { return s->pos; }
int64_t muser_session_n_ctx(const muser_session *s) { return s->e->n_ctx; }
/* A deferred row (mu_session_defer_row) comes to the host at its first reader. */
static void settle(muser_session *s) {
    if (!s->has_logits || s->lazy_row < 0) return;
    muser_engine *e = s->e;
    const int64_t V = e->model->m->cfg.n_vocab;
    e->be->download(e->be, s->logits, s->vrows + s->lazy_row * V, (size_t)V * sizeof(float));
    s->lazy_row = -1;
}

const float *muser_session_logits(const muser_session *s) {
    if (!s->has_logits) return NULL;
    if (s->lazy_row >= 0) {
        muser_session *w = (muser_session *)s; /* the row's bytes are the session's state; only its copy moves */
        lock(w->e);
        settle(w);
        unlock(w->e);
    }
    return s->logits;
}
muser_model *muser_session_model(const muser_session *s) { return s->e->model; }
muser_engine *muser_session_engine(const muser_session *s) { return s->e; }
const char *muser_session_error(const muser_session *s) { return s->error; }
int64_t muser_session_queued(const muser_session *s) { return s->q_len - s->q_done; }

static void poison(muser_session *s, const char *msg) {
    s->poisoned = true;
    s->has_logits = false;
    snprintf(s->error, sizeof s->error, "%s", msg);
}

/* n_regs: token registers MU_TOKEN_REG(0 .. n_regs) may stand for tokens. */
static bool check_input_regs(const muser_session *s, const int32_t *tokens, int64_t n, int n_regs, mu_error *err) {
    const int64_t n_vocab = s->e->model->m->cfg.n_vocab;
    if (s->poisoned) {
        mu_err_set(err, "session is poisoned (%.900s); reset it", s->error);
        return false;
    }
    if (s->q_done < s->q_len) {
        mu_err_set(err, "session has %lld queued rows; step the engine first", (long long)(s->q_len - s->q_done));
        return false;
    }
    if (n <= 0 || !tokens) {
        mu_err_set(err, "feed needs at least one token");
        return false;
    }
    if (n > s->e->n_ctx - s->pos) {
        mu_err_set(err, "context full: position %lld + %lld tokens exceeds n_ctx %lld",
                   (long long)s->pos, (long long)n, (long long)s->e->n_ctx);
        return false;
    }
    if (s->kv.ckpt_active && s->pos + n > s->kv.ckpt_pos + MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "checkpoint at position %lld allows %d rows; feeding %lld at %lld would exceed it (commit first)",
                   (long long)s->kv.ckpt_pos, MU_KV_MAX_ROLLBACK, (long long)n, (long long)s->pos);
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if ((tokens[i] < 0 && !(tokens[i] <= MU_TOKEN_REG(0) && tokens[i] > MU_TOKEN_REG(n_regs))) ||
            tokens[i] >= n_vocab) {
            mu_err_set(err, "token %lld (index %lld) is outside the vocabulary [0, %lld)",
                       (long long)tokens[i], (long long)i, (long long)n_vocab);
            return false;
        }
    return true;
}

static bool check_input(const muser_session *s, const int32_t *tokens, int64_t n, mu_error *err) {
    return check_input_regs(s, tokens, n, 0, err);
}

/* Room for n captured rows of this session's current input. */
static void capture_reserve(muser_session *s, int64_t n) {
    muser_engine *e = s->e;
    if (n < MU_CAPTURE_MIN_ROWS) n = MU_CAPTURE_MIN_ROWS;
    if (!s->capture_on || s->cap_cap >= n) return;
    const size_t row = (size_t)(e->capture.n * e->model->m->cfg.n_embd) * sizeof(float);
    if (s->cap_rows) e->be->free(e->be, s->cap_rows, (size_t)s->cap_cap * row);
    s->cap_rows = mu_backend_xalloc(e->be, (size_t)n * row, "captured rows");
    s->cap_cap = n;
}

/* ------------------------------------------------------------------ one forward */

/* A session's run of rows in the batch under construction. */
typedef struct seq_run {
    muser_session *s;
    int64_t first_row, n;       /* rows [first_row, first_row + n) of the batch */
    int64_t logit_row;          /* first of its logits rows in e->logits, -1 none */
    int64_t n_logits;
    float *out;                 /* host destination of those rows ([n_logits][V]) */
    int64_t cap_first;          /* first capture row in e->capture.rows, -1 none */
} seq_run;

/* Append session s's next n queued (or given) tokens to the batch. */
static void add_run(muser_engine *e, seq_run *run, int64_t *rows, int64_t *n_logit_rows, int64_t *n_cap_rows,
                    const int32_t *tokens, bool all_logits, bool last_logits, float *out) {
    muser_session *s = run->s;
    run->first_row = *rows;
    run->logit_row = -1;
    run->n_logits = 0;
    run->out = out;
    run->cap_first = s->capture_on ? *n_cap_rows : -1;
    for (int64_t i = 0; i < run->n; i++) {
        int64_t r = (*rows)++;
        e->b_token[r] = tokens[i];
        e->b_seq[r] = s->id;
        e->b_pos[r] = s->pos + i;
        e->b_logits[r] = all_logits || (last_logits && i == run->n - 1);
        e->b_cap[r] = s->capture_on ? (*n_cap_rows)++ : -1;
        if (e->b_logits[r]) {
            if (run->logit_row < 0) run->logit_row = *n_logit_rows;
            run->n_logits++;
            (*n_logit_rows)++;
        }
    }
}

static bool check_finite(muser_session *s, const float *rows, int64_t n, int64_t pos0) {
    const int64_t V = s->e->model->m->cfg.n_vocab, i = mu_first_nonfinite(rows, n * V);
    if (i == n * V) return true;
    char msg[200];
    snprintf(msg, sizeof msg, "non-finite logit %g for token %lld at position %lld (refusing to sample)", (double)rows[i],
             (long long)(i % V), (long long)(pos0 + i / V));
    poison(s, msg);
    return false;
}

/* Record tokens fed at pos0 (only while the record is complete). */
static void hist_append(muser_session *s, int64_t pos0, const int32_t *t, int64_t n) {
    if (s->n_hist != pos0 || n <= 0) return;
    if (s->n_hist + n > s->hist_cap) {
        s->hist_cap = (s->n_hist + n) * 2 + 64;
        s->hist = mu_xrealloc(s->hist, (size_t)s->hist_cap * sizeof *s->hist);
    }
    memcpy(s->hist + s->n_hist, t, (size_t)n * sizeof *t);
    s->n_hist += n;
}

/* The name of a batch's shape for forward_begin: rows, and per row its
 * sequence, its position's 256-key block, logits and capture row; chained
 * (1: a host token, 2: the chained one): a forward that ends with chain_pick. */
static uint64_t batch_key(const muser_engine *e, int64_t rows, int64_t n_cap_rows, int chained) {
    uint64_t key = 0xCBF29CE484222325ull ^ (uint64_t)rows;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = e->b_is_tree ? e->b_tpos[r] : e->b_pos[r]; /* where its keys end */
        const uint64_t v[4] = {(uint64_t)e->b_seq[r], (uint64_t)(at >> 8), (uint64_t)e->b_logits[r],
                               (uint64_t)(n_cap_rows ? e->b_cap[r] : -1)};
        for (int i = 0; i < 4; i++) key = (key ^ v[i]) * 0x100000001B3ull;
    }
    return chained ? (key ^ (0x636861696Eull + (uint64_t)chained)) * 0x100000001B3ull : key;
}

/* Run the batch of `rows` rows made of runs[0..n_runs): forward, logits
 * read back, captured rows moved to each session, positions advanced.
 * false only when the forward itself failed (every session in it is then
 * poisoned); a non-finite row poisons its own session only. */
static bool run_batch(muser_engine *e, seq_run *runs, int n_runs, int64_t rows, int64_t n_cap_rows, mu_error *err) {
    const mu_model *m = e->model->m;
    const int64_t V = m->cfg.n_vocab, E = m->cfg.n_embd;
    bool any_logits = false;
    for (int64_t r = 0; r < rows; r++) any_logits |= e->b_logits[r];
    if (n_cap_rows && !e->capture.rows) {
        const size_t row = (size_t)(e->capture.n * E) * sizeof(float);
        e->capture.rows = mu_backend_xalloc(e->be, (size_t)e->n_batch * row, "the capture rows");
        e->capture.cap = e->n_batch;
    }
    mu_batch b = {.n = rows, .token = e->b_token, .seq = e->b_seq, .pos = e->b_pos,
                  .logits = any_logits ? e->b_logits : NULL, .cap_row = n_cap_rows ? e->b_cap : NULL,
                  .tpos = e->b_is_tree ? e->b_tpos : NULL, .tree = e->b_is_tree ? e->b_tree : NULL};
    /* Few rows (decode, verification): a backend may replay this shape's
     * launches (forward_begin). The key: rows, and per row its sequence,
     * its position's 256-key block, logits and capture row. */
    const bool bracket = e->be->forward_begin && rows <= 16;
    if (bracket) e->be->forward_begin(e->be, batch_key(e, rows, n_cap_rows, e->b_is_tree ? 4 : 0));
    const bool fwd_ok =
        mu_forward(m, e->be, e->kvs, &e->scratch, e->inv_freq, &b, e->logits, n_cap_rows ? &e->capture : NULL, err);
    if (bracket) e->be->forward_end(e->be, fwd_ok);
    if (!fwd_ok) {
        for (int i = 0; i < n_runs; i++) poison(runs[i].s, err->msg);
        return false;
    }
    /* Every logits row of this forward (rows [0, n_out) of e->logits) is
     * scanned once, where it lies; only when that finds a non-finite value
     * (or the backend left the scan to the host: -1) does each session scan
     * its own rows, for the message (check_finite). */
    int64_t n_out = 0;
    for (int i = 0; i < n_runs; i++) n_out += runs[i].n_logits;
    const int64_t first_bad = n_out > 0 ? e->be->first_nonfinite(e->be, e->logits, n_out * V) : 0;
    const bool any_bad = n_out > 0 && (first_bad < 0 || first_bad < n_out * V);
    for (int i = 0; i < n_runs; i++) {
        seq_run *run = &runs[i];
        muser_session *s = run->s;
        if (run->cap_first >= 0) {
            const size_t row = (size_t)(e->capture.n * E) * sizeof(float);
            e->be->copy(e->be, (uint8_t *)s->cap_rows + (size_t)s->captured_rows * row,
                        (uint8_t *)e->capture.rows + (size_t)run->cap_first * row, (size_t)run->n * row);
            s->captured_rows += run->n;
        }
        const int64_t pos0 = s->pos;
        hist_append(s, pos0, e->b_token + run->first_row, run->n);
        s->pos += run->n;
        if (run->n_logits) {
            e->be->download(e->be, run->out, e->logits + run->logit_row * V, (size_t)(run->n_logits * V) * sizeof(float));
            if (any_bad && !check_finite(s, run->out, run->n_logits, pos0 + run->n - run->n_logits)) continue;
        }
    }
    return true;
}

/* ------------------------------------------------------------------ feed */

/* This session's rows alone, in forwards of at most chunk rows (and at
 * most n_logits rows when every row's logits are wanted). */
static bool feed_locked(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, mu_error *err) {
    muser_engine *e = s->e;
    if (!check_input(s, tokens, n, err)) return false;
    const int64_t V = e->model->m->cfg.n_vocab;
    s->has_logits = false;
    s->captured_rows = 0;
    capture_reserve(s, n);
    const int64_t per = all_out && e->n_logits < e->chunk ? e->n_logits : e->chunk;
    for (int64_t done = 0; done < n;) {
        seq_run run = {.s = s, .n = n - done < per ? n - done : per};
        const bool last = done + run.n == n;
        int64_t rows = 0, n_logit_rows = 0, n_cap = 0;
        add_run(e, &run, &rows, &n_logit_rows, &n_cap, tokens + done, all_out != NULL, last,
                all_out ? all_out + done * V : s->logits);
        if (!run_batch(e, &run, 1, rows, n_cap, err)) return false;
        if (s->poisoned) {
            mu_err_set(err, "%s", s->error);
            return false;
        }
        done += run.n;
    }
    if (all_out) memcpy(s->logits, all_out + (n - 1) * V, (size_t)V * sizeof(float));
    s->has_logits = true;
    s->lazy_row = -1;
    return true;
}

/* A token tree in one forward (capture.h). */
static bool feed_tree_locked(muser_session *s, const int32_t *tokens, const int32_t *parent, int64_t n, float *out,
                             mu_error *err) {
    muser_engine *e = s->e;
    if (!check_input(s, tokens, n, err)) return false;
    if (!e->be->trees) {
        mu_err_set(err, "token tree: the %s backend's attention does not take tree rows", e->be->name);
        return false;
    }
    int64_t most = MU_TREE_MAX; /* one forward, every row's logits */
    if (e->n_logits < most) most = e->n_logits;
    if (e->chunk < most) most = e->chunk;
    if (n > most) {
        mu_err_set(err, "token tree of %lld rows: at most %lld here", (long long)n, (long long)most);
        return false;
    }
    int32_t depth[MU_TREE_MAX];
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 ? parent[0] != -1 : parent[i] < 0 || parent[i] >= i) {
            mu_err_set(err, "token tree: row %lld's parent %d (the root's must be -1, every other row's an earlier row)",
                       (long long)i, parent[i]);
            return false;
        }
        depth[i] = i ? depth[parent[i]] + 1 : 0;
        mu_attn_tree *t = &e->b_tree[i];
        t->base = s->pos;
        for (int32_t r = (int32_t)i, d = depth[i]; d >= 0; r = parent[r], d--) t->anc[d] = r;
        e->b_tpos[i] = s->pos + depth[i];
    }
    const int64_t V = e->model->m->cfg.n_vocab;
    s->has_logits = false;
    s->captured_rows = 0;
    capture_reserve(s, n);
    seq_run run = {.s = s, .n = n};
    int64_t rows = 0, n_logit_rows = 0, n_cap = 0;
    add_run(e, &run, &rows, &n_logit_rows, &n_cap, tokens, true, true, out);
    e->b_is_tree = true;
    const bool ok = run_batch(e, &run, 1, rows, n_cap, err);
    e->b_is_tree = false;
    if (!ok) return false;
    if (s->poisoned) {
        mu_err_set(err, "%s", s->error);
        return false;
    }
    memcpy(s->logits, out + (n - 1) * V, (size_t)V * sizeof(float));
    s->has_logits = true;
    s->lazy_row = -1;
    return true;
}

bool mu_session_feed_tree(muser_session *s, const int32_t *tokens, const int32_t *parent, int64_t n, float *out,
                          mu_error *err) {
    lock(s->e);
    bool ok = feed_tree_locked(s, tokens, parent, n, out, err);
    unlock(s->e);
    return ok;
}

bool mu_session_keep_path(muser_session *s, int64_t pos0, const int32_t *tokens, const int32_t *path, int n,
                          mu_error *err) {
    int64_t from[MU_TREE_MAX], to[MU_TREE_MAX];
    if (n < 1 || n > MU_TREE_MAX || path[0] != 0) {
        mu_err_set(err, "tree path of %d rows: must start at the root and hold at most %d", n, MU_TREE_MAX);
        return false;
    }
    for (int j = 0; j < n; j++) {
        from[j] = pos0 + path[j];
        to[j] = pos0 + j;
        if (j && path[j] <= path[j - 1]) {
            mu_err_set(err, "tree path: row %d follows row %d (a path's rows ascend)", path[j], path[j - 1]);
            return false;
        }
    }
    lock(s->e);
    bool ok = s->q_done == s->q_len && mu_kv_move(&s->kv, from, to, n, err) && mu_kv_rollback(&s->kv, pos0 + n, err);
    if (s->q_done < s->q_len) mu_err_set(err, "tree path: the session has queued input");
    if (ok) {
        s->pos = pos0 + n;
        if (s->n_hist > pos0 + n) s->n_hist = pos0 + n;
        for (int j = 1; j < n; j++)
            if (pos0 + j < s->n_hist) s->hist[pos0 + j] = tokens[path[j]];
        s->has_logits = false;
    }
    unlock(s->e);
    return ok;
}

bool muser_session_feed(muser_session *s, const int32_t *tokens, int64_t n, muser_error *err) {
    lock(s->e);
    bool ok = feed_locked(s, tokens, n, NULL, ERR(err));
    unlock(s->e);
    return ok;
}

bool muser_session_feed_all(muser_session *s, const int32_t *tokens, int64_t n, float *out, muser_error *err) {
    if (!out) {
        mu_err_set(ERR(err), "feed_all needs an output buffer");
        return false;
    }
    lock(s->e);
    bool ok = feed_locked(s, tokens, n, out, ERR(err));
    unlock(s->e);
    return ok;
}

/* capture.h: one forward of the tokens (host ids or token registers) with
 * every row's logits left on the backend and pick_rows over them; the
 * record holds the registers until mu_session_resolve_regs. */
bool mu_session_feed_picks(muser_session *s, const int32_t *tokens, int64_t n, int n_regs, bool tree_reg,
                           int32_t *slot, mu_error *err) {
    muser_engine *e = s->e;
    mu_backend *be = e->be;
    lock(e);
    bool ok = false;
    if (!be->pick_rows || !be->argmax_reg) {
        mu_err_set(err, "feed_picks: the %s backend has no token registers", be->name);
    } else if (tree_reg && (!be->tree_reg || !be->trees)) {
        mu_err_set(err, "feed_picks: the %s backend has no tree registers", be->name);
    } else if (n > e->n_logits || n > 16 || n_regs > MU_TOKEN_REGS) {
        mu_err_set(err, "feed_picks: %lld rows (%d registers) is more than one bracketed forward takes", (long long)n,
                   n_regs);
    } else if (check_input_regs(s, tokens, n, n_regs, err)) {
        const mu_model *m = e->model->m;
        s->has_logits = false;
        s->captured_rows = 0;
        capture_reserve(s, n);
        seq_run run = {.s = s, .n = n};
        int64_t rows = 0, n_logit_rows = 0, n_cap = 0;
        add_run(e, &run, &rows, &n_logit_rows, &n_cap, tokens, true, true, NULL);
        if (n_cap && !e->capture.rows) {
            const size_t row = (size_t)(e->capture.n * m->cfg.n_embd) * sizeof(float);
            e->capture.rows = mu_backend_xalloc(be, (size_t)e->n_batch * row, "the capture rows");
            e->capture.cap = e->n_batch;
        }
        const int64_t V = m->cfg.n_vocab;
        if (!s->vrows) s->vrows = mu_backend_xalloc(be, (size_t)(16 * V) * sizeof(float), "verification rows");
        for (int64_t r = 0; r < n; r++) slot[2 * r + 1] = 0;
        for (int64_t r = 0; tree_reg && r < n; r++) { /* the shape is the registers': positions only bound */
            e->b_tree[r].base = s->pos;
            e->b_tpos[r] = s->pos + r;
        }
        mu_batch b = {.n = rows, .token = e->b_token, .seq = e->b_seq, .pos = e->b_pos, .logits = e->b_logits,
                      .cap_row = n_cap ? e->b_cap : NULL, .tpos = tree_reg ? e->b_tpos : NULL,
                      .tree = tree_reg ? e->b_tree : NULL, .tree_reg = tree_reg};
        if (be->forward_begin) be->forward_begin(be, batch_key(e, rows, n_cap, tree_reg ? 5 : 3));
        ok = mu_forward(m, be, e->kvs, &e->scratch, e->inv_freq, &b, e->logits, n_cap ? &e->capture : NULL, err);
        if (ok) { /* picked where they lie (the host wakes on the picks), then moved to the session's own
                   * buffer: a later forward of another session reuses e->logits */
            be->pick_rows(be, e->logits, V, n, n_regs, slot);
            be->copy(be, s->vrows, e->logits, (size_t)(n * V) * sizeof(float));
        }
        if (be->forward_end) be->forward_end(be, ok);
        if (!ok) {
            poison(s, err->msg);
        } else {
            if (n_cap) {
                const size_t row = (size_t)(e->capture.n * m->cfg.n_embd) * sizeof(float);
                be->copy(be, s->cap_rows, e->capture.rows, (size_t)n * row);
                s->captured_rows = n;
            }
            hist_append(s, s->pos, tokens, n);
            s->pos += n;
        }
    }
    unlock(e);
    return ok;
}

int64_t mu_session_picks_max(const muser_session *s) {
    const muser_engine *e = s->e;
    return e->be->pick_rows && e->be->argmax_reg ? (e->n_logits < 16 ? e->n_logits : 16) : 0;
}

void mu_session_resolve_regs(muser_session *s, int64_t pos0, const int32_t *regs, int n_regs) {
    lock(s->e);
    for (int64_t p = pos0; p < s->n_hist; p++)
        if (s->hist[p] <= MU_TOKEN_REG(0) && s->hist[p] > MU_TOKEN_REG(n_regs)) s->hist[p] = regs[MU_TOKEN_REG(0) - s->hist[p]];
    unlock(s->e);
}

void mu_session_defer_row(muser_session *s, int64_t row) {
    lock(s->e);
    s->has_logits = true;
    s->lazy_row = row;
    unlock(s->e);
}

bool mu_session_fetch_rows(muser_session *s, int64_t n, float *out, mu_error *err) {
    muser_engine *e = s->e;
    const int64_t V = e->model->m->cfg.n_vocab;
    lock(e);
    e->be->download(e->be, out, s->vrows, (size_t)(n * V) * sizeof(float));
    const bool ok = check_finite(s, out, n, s->pos - n);
    if (!ok) mu_err_set(err, "%s", s->error);
    unlock(e);
    return ok;
}

/* ------------------------------------------------------------------ submit and step */

/* ------------------------------------------------------------------ the greedy chain */

bool muser_session_can_chain(const muser_session *s) { return s->e->be->chain_pick && s->e->be->chain_wait; }

static bool truncate_locked(muser_session *s, int64_t n, mu_error *err) {
    if (s->q_done < s->q_len) {
        mu_err_set(err, "truncate: the session has queued input");
        return false;
    }
    if (n < 0) {
        mu_err_set(err, "truncate to %lld: negative", (long long)n);
        return false;
    }
    if (n >= s->pos) return true;
    if (!mu_kv_truncate(&s->kv, n, err)) return false;
    s->pos = n;
    if (s->n_hist > n) s->n_hist = n;
    s->has_logits = false;
    s->captured_rows = 0;
    return true;
}

/* One forward of one row, token (a host id or MU_TOKEN_CHAINED) at s->pos,
 * ending with chain_pick into slot: the logits stay on the backend. A
 * chained token enters the record as MU_TOKEN_CHAINED until the pick
 * that made it is confirmed (chain_confirm). */
static bool chain_forward(muser_session *s, int32_t token, int32_t *slot, mu_error *err) {
    muser_engine *e = s->e;
    const mu_model *m = e->model->m;
    e->b_token[0] = token, e->b_seq[0] = s->id, e->b_pos[0] = s->pos, e->b_logits[0] = true, e->b_cap[0] = -1;
    mu_batch b = {.n = 1, .token = e->b_token, .seq = e->b_seq, .pos = e->b_pos, .logits = e->b_logits};
    slot[1] = 0;
    /* a host token and a chained one are launched differently (an upload or none) */
    if (e->be->forward_begin) e->be->forward_begin(e->be, batch_key(e, 1, 0, token == MU_TOKEN_CHAINED ? 2 : 1));
    const bool ok = mu_forward(m, e->be, e->kvs, &e->scratch, e->inv_freq, &b, e->logits, NULL, err);
    if (ok) e->be->chain_pick(e->be, e->logits, m->cfg.n_vocab, slot);
    if (e->be->forward_end) e->be->forward_end(e->be, ok);
    if (!ok) {
        poison(s, err->msg);
        return false;
    }
    hist_append(s, s->pos, &token, 1);
    s->pos++;
    return true;
}

/* Wait for the picks of the forwards still in flight (their slots are
 * about to be reused or dropped). */
static bool chain_drain(muser_session *s, int head, int n_q, mu_error *err) {
    for (int i = 0; i < n_q; i++)
        if (!s->e->be->chain_wait(s->e->be, s->chain_slots + 2 * ((head + i) % CHAIN_AHEAD), err)) return false;
    return true;
}

/* include/muser.h. The host stays up to CHAIN_AHEAD forwards ahead of the
 * rows it has looked at: q[] holds the positions of the forwards in
 * flight, oldest at head; cur is the token at the oldest one's position. A
 * next() value other than the pick those forwards assumed (or a row the
 * backend could not decide) drops them: the session goes back to right
 * after that row, and the chain starts again from the host's token. */
static int64_t decode_chain_locked(muser_session *s, int32_t first, int64_t max_feed,
                                   int32_t (*next)(void *, int32_t, const float *), void *user, mu_error *err) {
    muser_engine *e = s->e;
    mu_backend *be = e->be;
    const int64_t V = e->model->m->cfg.n_vocab;
    if (!muser_session_can_chain(s)) {
        mu_err_set(err, "decode_chain: the %s backend has no greedy chain", be->name);
        return -1;
    }
    if (s->capture_on || s->kv.ckpt_active) {
        mu_err_set(err, "decode_chain: the session has %s", s->capture_on ? "capture on" : "an active checkpoint");
        return -1;
    }
    if (!check_input(s, &first, 1, err)) return -1;
    if (!s->chain_slots) {
        const size_t bytes = CHAIN_AHEAD * 2 * sizeof(int32_t);
        s->chain_slots = be->host_alloc ? be->host_alloc(be, bytes) : mu_xmalloc(bytes);
        if (!s->chain_slots) {
            mu_err_set(err, "decode_chain: no page-locked memory for %zu bytes", bytes);
            return -1;
        }
    }
    s->has_logits = false;
    s->captured_rows = 0;
    /* MUSER_CHAIN_UNDECIDED=N: every Nth row goes to next() as undecided (tests of that way) */
    const char *und = getenv("MUSER_CHAIN_UNDECIDED");
    const int64_t every = und && *und ? strtoll(und, NULL, 10) : 0;
    const int64_t end = max_feed >= 0 && max_feed < e->n_ctx - s->pos ? s->pos + max_feed : e->n_ctx;
    int64_t q[CHAIN_AHEAD], calls = 0;
    int head = 0, n_q = 0;
    int32_t feed = first, cur = first;
    bool host_token = true;
    for (;;) {
        while (n_q < CHAIN_AHEAD && s->pos < end) {
            const int k = (head + n_q) % CHAIN_AHEAD;
            q[k] = s->pos;
            if (!chain_forward(s, host_token ? feed : MU_TOKEN_CHAINED, s->chain_slots + 2 * k, err)) {
                mu_error ignored;
                chain_drain(s, head, n_q, &ignored); /* poisoned already: only the slots matter */
                return -1;
            }
            n_q++;
            host_token = false;
        }
        if (n_q == 0) break; /* the context is full, or max_feed tokens are in */
        int32_t *slot = s->chain_slots + 2 * head;
        const int64_t p = q[head];
        if (!be->chain_wait(be, slot, err)) {
            poison(s, err->msg);
            return -1;
        }
        head = (head + 1) % CHAIN_AHEAD, n_q--;
        int32_t pick = slot[1] == 1 && !(every > 0 && (calls + 1) % every == 0) ? slot[0] : -1;
        int32_t r = pick >= 0 ? next(user, pick, NULL) : MUSER_CHAIN_ROW;
        if (r == MUSER_CHAIN_ROW) { /* the row itself: back before it, and its token fed again the usual way */
            if (!chain_drain(s, head, n_q, err) || !truncate_locked(s, p, err)) return -1;
            n_q = 0;
            if (!feed_locked(s, &cur, 1, NULL, err)) return -1;
            pick = -1;
            r = next(user, -1, s->logits);
            if (r == MUSER_CHAIN_ROW) {
                mu_err_set(err, "decode_chain: next() asked again for the row it was given");
                return -1;
            }
        }
        calls++;
        if (r >= 0 && r == pick) { /* the forward after it fed r already */
            cur = r;
            if (s->n_hist > p + 1 && s->hist[p + 1] == MU_TOKEN_CHAINED) s->hist[p + 1] = r;
            continue;
        }
        if (!chain_drain(s, head, n_q, err) || !truncate_locked(s, p + 1, err)) return -1;
        n_q = 0;
        if (r >= V) {
            mu_err_set(err, "decode_chain: next() returned token %d, outside the vocabulary [0, %lld)", r, (long long)V);
            return -1;
        }
        if (r < 0) break;
        feed = cur = r, host_token = true;
    }
    s->has_logits = false;
    return calls;
}

int64_t muser_session_decode_chain(muser_session *s, int32_t first, int64_t max_feed,
                                   int32_t (*next)(void *user, int32_t token, const float *row), void *user,
                                   muser_error *err) {
    lock(s->e);
    const int64_t n = decode_chain_locked(s, first, max_feed, next, user, ERR(err));
    unlock(s->e);
    return n;
}

static bool submit(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, bool prompt, muser_error *err) {
    muser_engine *e = s->e;
    lock(e);
    bool ok = check_input(s, tokens, n, ERR(err));
    if (ok) {
        if (n > s->q_cap) {
            s->q_cap = n;
            s->q = mu_xrealloc(s->q, (size_t)n * sizeof *s->q);
        }
        memcpy(s->q, tokens, (size_t)n * sizeof *tokens);
        s->q_len = n;
        s->q_done = 0;
        s->q_all_out = all_out;
        s->q_order = ++e->submit_clock;
        s->q_prompt = prompt;
        s->has_logits = false;
        s->captured_rows = 0;
        capture_reserve(s, n);
    }
    unlock(e);
    return ok;
}

bool muser_session_submit(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, muser_error *err) {
    return submit(s, tokens, n, all_out, false, err);
}

bool muser_session_submit_prompt(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, muser_error *err) {
    return submit(s, tokens, n, all_out, true, err);
}

static int cmp_order(const void *a, const void *b) {
    const muser_session *x = *(muser_session *const *)a, *y = *(muser_session *const *)b;
    return (x->q_order > y->q_order) - (x->q_order < y->q_order);
}

/* Sessions with queued input, oldest submission first. */
static int32_t queued_sessions(muser_engine *e, muser_session **out) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_seq_max; i++)
        if (e->seqs[i] && e->seqs[i]->q_done < e->seqs[i]->q_len) out[n++] = e->seqs[i];
    qsort(out, (size_t)n, sizeof *out, cmp_order);
    return n;
}

int32_t muser_engine_step(muser_engine *e, muser_step_info *info, muser_error *err) {
    muser_step_info local = {0};
    if (!info) info = &local;
    *info = (muser_step_info){0};
    lock(e);
    const int64_t V = e->model->m->cfg.n_vocab;
    muser_session **order = mu_xmalloc((size_t)e->n_seq_max * sizeof *order);
    seq_run *runs = mu_xmalloc((size_t)e->n_seq_max * sizeof *runs);
    const int32_t n_q = queued_sessions(e, order);
    int64_t rows = 0, n_logit_rows = 0, n_cap = 0;
    int n_runs = 0;
    /* two passes: decode / verification blocks whole, then prompt chunks */
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < n_q; i++) {
            muser_session *s = order[i];
            const int64_t left = s->q_len - s->q_done;
            /* whole in one forward: a decode token or a verification block */
            const bool small = !s->q_prompt && left <= STEP_DECODE_MAX && left <= e->chunk;
            if (small != (pass == 0)) continue;
            int64_t n = left < e->chunk ? left : e->chunk;
            if (!small && e->chunk_by_depth) n = mu_prompt_rows(n, s->pos, e->n_ctx);
            if (n > e->n_batch - rows) n = e->n_batch - rows;
            /* a prompt chunk beside generating sessions delays each of their next tokens by its
             * cost: keep it within the budget (the rest goes to later steps) */
            if (!small && info->decode_rows > 0 && e->prefill_budget > 0 &&
                n > e->prefill_budget - info->prefill_rows)
                n = e->prefill_budget - info->prefill_rows;
            const bool all = s->q_all_out != NULL;
            if (all && n > e->n_logits - n_logit_rows) n = e->n_logits - n_logit_rows;
            const bool completes = n == left;
            if (n <= 0 || (small && !completes) || (!all && completes && n_logit_rows == e->n_logits)) continue;
            seq_run *run = &runs[n_runs++];
            *run = (seq_run){.s = s, .n = n};
            float *out = all ? s->q_all_out + s->q_done * V : s->logits;
            add_run(e, run, &rows, &n_logit_rows, &n_cap, s->q + s->q_done, all, completes, out);
            if (small) info->decode_rows += n;
            else info->prefill_rows += n;
        }
    int32_t completed = 0;
    int32_t rc = 0;
    if (rows > 0) {
        mu_error ferr = {{0}};
        if (!run_batch(e, runs, n_runs, rows, n_cap, &ferr)) {
            mu_err_set(ERR(err), "%s", ferr.msg);
            rc = -1;
        } else {
            for (int i = 0; i < n_runs; i++) {
                muser_session *s = runs[i].s;
                s->q_done += runs[i].n;
                if (s->poisoned) {
                    s->q_len = s->q_done = 0;
                    continue;
                }
                if (s->q_done == s->q_len) {
                    if (s->q_all_out) memcpy(s->logits, s->q_all_out + (s->q_len - 1) * V, (size_t)V * sizeof(float));
                    s->has_logits = true;
                    s->lazy_row = -1;
                    s->q_all_out = NULL;
                    completed++;
                }
            }
            rc = completed;
        }
    }
    info->rows = rows;
    info->sessions = n_runs;
    info->completed = completed;
    free(order);
    free(runs);
    unlock(e);
    return rc;
}

/* ------------------------------------------------------------------ checkpoints, forks, snapshots */

bool muser_session_truncate(muser_session *s, int64_t n, muser_error *err) {
    lock(s->e);
    const bool ok = truncate_locked(s, n, ERR(err));
    unlock(s->e);
    return ok;
}

void muser_session_cancel_queued(muser_session *s) {
    lock(s->e);
    s->q_len = s->q_done = 0;
    s->q_all_out = NULL;
    unlock(s->e);
}

bool muser_session_checkpoint(muser_session *s, muser_error *err) {
    lock(s->e);
    bool ok = mu_kv_checkpoint(&s->kv, ERR(err));
    unlock(s->e);
    return ok;
}

bool muser_session_rollback(muser_session *s, int64_t pos, muser_error *err) {
    lock(s->e);
    bool ok = s->q_done == s->q_len && mu_kv_rollback(&s->kv, pos, ERR(err));
    if (s->q_done < s->q_len) mu_err_set(ERR(err), "rollback: the session has queued input");
    if (ok) {
        s->pos = pos;
        if (s->n_hist > pos) s->n_hist = pos;
        s->has_logits = false;
    }
    unlock(s->e);
    return ok;
}

void muser_session_commit(muser_session *s) {
    lock(s->e);
    mu_kv_commit(&s->kv);
    unlock(s->e);
}

bool muser_session_fork(muser_session *dst, const muser_session *src, int64_t n, muser_error *err) {
    if (dst->e != src->e) {
        mu_err_set(ERR(err), "fork: the sessions belong to different engines");
        return false;
    }
    lock(dst->e);
    bool ok = false;
    if (dst == src) mu_err_set(ERR(err), "fork: source and destination are the same session");
    else if (src->poisoned) mu_err_set(ERR(err), "fork: the source session is poisoned (%.900s)", src->error);
    else if (n < 0 || n > src->pos) mu_err_set(ERR(err), "fork: %lld tokens; the source holds %lld", (long long)n, (long long)src->pos);
    else if (dst->q_done < dst->q_len || src->q_done < src->q_len) mu_err_set(ERR(err), "fork: a session has queued input");
    else ok = mu_kv_fork(&dst->kv, &src->kv, n, ERR(err)); /* validates before it touches dst */
    if (ok) {
        dst->pos = n;
        dst->n_hist = 0;
        if (src->n_hist >= n) hist_append(dst, 0, src->hist, n);
        dst->poisoned = false;
        dst->error[0] = 0;
        dst->captured_rows = 0;
        settle((muser_session *)src); /* the row's copy on the host, the state unchanged */
        dst->has_logits = n == src->pos && src->has_logits;
        dst->lazy_row = -1;
        if (dst->has_logits) memcpy(dst->logits, src->logits, (size_t)dst->e->model->m->cfg.n_vocab * sizeof(float));
    }
    unlock(dst->e);
    return ok;
}

muser_snapshot *muser_session_snapshot(const muser_session *s) {
    lock(s->e);
    muser_snapshot *snap = mu_xcalloc(1, sizeof *snap);
    snap->kv = mu_kv_snapshot_take(&s->kv);
    snap->pos = s->pos;
    const size_t V = (size_t)s->e->model->m->cfg.n_vocab;
    settle((muser_session *)s); /* the row's copy on the host, the state unchanged */
    if (s->has_logits) {
        snap->logits = malloc(V * sizeof(float));
        if (snap->logits) memcpy(snap->logits, s->logits, V * sizeof(float));
    }
    snap->n_hist = s->n_hist;
    snap->hist = malloc((size_t)(s->n_hist ? s->n_hist : 1) * sizeof *snap->hist);
    if (snap->hist && s->n_hist) memcpy(snap->hist, s->hist, (size_t)s->n_hist * sizeof *snap->hist);
    const bool complete = snap->kv && snap->hist && (!s->has_logits || snap->logits);
    unlock(s->e);
    if (!complete) {
        muser_snapshot_free(snap);
        return NULL;
    }
    return snap;
}

bool muser_session_restore(muser_session *s, const muser_snapshot *snap, muser_error *err) {
    if (!snap) {
        mu_err_set(ERR(err), "restore: snapshot is NULL");
        return false;
    }
    lock(s->e);
    bool ok = s->q_done == s->q_len;
    if (!ok) mu_err_set(ERR(err), "restore: the session has queued input");
    ok = ok && mu_kv_snapshot_restore(&s->kv, snap->kv, ERR(err));
    if (ok) {
        s->pos = snap->pos;
        s->has_logits = snap->logits != NULL;
        s->lazy_row = -1;
        if (snap->logits) memcpy(s->logits, snap->logits, (size_t)s->e->model->m->cfg.n_vocab * sizeof(float));
        s->n_hist = 0;
        hist_append(s, 0, snap->hist, snap->n_hist);
        s->captured_rows = 0;
        s->poisoned = false;
        s->error[0] = 0;
    }
    unlock(s->e);
    return ok;
}

void muser_snapshot_free(muser_snapshot *snap) {
    if (!snap) return;
    mu_kv_snapshot_free(snap->kv);
    free(snap->logits);
    free(snap->hist);
    free(snap);
}

/* ------------------------------------------------------------------ capture (model/capture.h) */

bool mu_session_set_capture(muser_session *s, const int *boundaries, int n, mu_error *err) {
    muser_engine *e = s->e;
    const int64_t n_layer = e->model->m->cfg.n_layer;
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
    lock(e);
    const size_t E = (size_t)e->model->m->cfg.n_embd;
    const bool same = e->capture.n == n && (!n || !memcmp(e->capture.slot, slot, (size_t)(n_layer + 1) * sizeof *slot));
    const int others = e->n_capturing - (s->capture_on ? 1 : 0);
    if (n && !same && others > 0) {
        unlock(e);
        free(slot);
        mu_err_set(err, "capture: another session of this engine captures other boundaries");
        return false;
    }
    if (s->cap_rows) e->be->free(e->be, s->cap_rows, (size_t)s->cap_cap * (size_t)e->capture.n * E * sizeof(float));
    s->cap_rows = NULL;
    s->cap_cap = s->captured_rows = 0;
    if (s->capture_on) e->n_capturing--;
    s->capture_on = n > 0;
    if (s->capture_on) e->n_capturing++;
    if (n && !same) {
        if (e->capture.rows) e->be->free(e->be, e->capture.rows, (size_t)e->capture.cap * (size_t)e->capture.n * E * sizeof(float));
        free(e->capture.slot);
        e->capture = (mu_capture){.n = n, .slot = slot};
        slot = NULL;
    }
    free(slot);
    unlock(e);
    return true;
}

void mu_session_set_spec(muser_session *s, muser_spec *sp) { s->spec = sp; }

void mu_session_set_logits(muser_session *s, const float *row) {
    lock(s->e);
    memcpy(s->logits, row, (size_t)s->e->model->m->cfg.n_vocab * sizeof *row);
    s->has_logits = true;
    s->lazy_row = -1;
    unlock(s->e);
}
muser_spec *mu_session_spec(const muser_session *s) { return s->spec; }

const float *mu_session_captured(const muser_session *s, int64_t *n_rows) {
    *n_rows = s->capture_on ? s->captured_rows : 0;
    return *n_rows ? s->cap_rows : NULL;
}

mu_kv_cache *mu_session_kv(muser_session *s) { return &s->kv; }

void mu_session_set_pos(muser_session *s, int64_t pos) {
    s->pos = pos;
    s->has_logits = false;
}

/* ------------------------------------------------------------------ durable packs (src/kvpack/) */

void mu_session_lock(muser_session *s) { lock(s->e); }
void mu_session_unlock(muser_session *s) { unlock(s->e); }

const int32_t *mu_session_hist(const muser_session *s, int64_t *n) {
    *n = s->n_hist;
    return s->hist;
}

bool mu_session_busy(const muser_session *s) { return s->q_done < s->q_len; }
bool mu_session_poisoned(const muser_session *s) { return s->poisoned; }

bool mu_session_new_kv(const muser_session *s, mu_kv_cache *out, mu_error *err) {
    const mu_kv_cache *c = &s->kv;
    const mu_model_config *cfg = &s->e->model->m->cfg;
    return mu_kv_init(out, c->be, c->n_layers, cfg->is_swa, c->window, c->slack, c->n_ctx, cfg->n_head_kv,
                      cfg->head_dim, err);
}

void mu_session_install(muser_session *s, mu_kv_cache *staged, const int32_t *tokens, int64_t n,
                        const float *logits) {
    mu_kv_cache old = s->kv;
    s->kv = *staged;          /* e->kvs[s->id] points at s->kv: the swap is this one assignment */
    *staged = old;
    mu_kv_free(staged);
    s->pos = n;
    s->n_hist = 0;
    hist_append(s, 0, tokens, n);
    memcpy(s->logits, logits, (size_t)s->e->model->m->cfg.n_vocab * sizeof(float));
    s->has_logits = true;
    s->lazy_row = -1;
    s->captured_rows = 0;
    s->poisoned = false;
    s->error[0] = 0;
}

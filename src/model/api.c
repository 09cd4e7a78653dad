/* The public embedding API (include/muser.h) over model, backend and KV. */
#include "model/api_internal.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/repack.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

_Static_assert(sizeof(muser_error) == sizeof(mu_error), "error structs must match");

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
    case MUSER_BACKEND_DEFAULT: { /* CUDA when built with it and a device is present, else the fast CPU backend */
        mu_error cerr;
        mu_backend *cu = mu_backend_cuda_create(n_threads, &cerr);
        if (cu) {
            fprintf(stderr, "muser: backend auto: cuda\n");
            return cu;
        }
        return mu_backend_cpu_create(n_threads);
    }
    case MUSER_BACKEND_CPU:
        return mu_backend_cpu_create(n_threads);
    case MUSER_BACKEND_CUDA:
        return mu_backend_cuda_create(n_threads, err);
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
    pthread_mutex_init(&mm->ident_lock, NULL);
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
    pthread_mutex_destroy(&m->ident_lock);
    free(m->kv_identity);
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


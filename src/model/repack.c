/* Load-time weight layouts (repack.h). */
#include "model/repack.h"
#include "util/common.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static bool set_protection(const uint8_t *p, uint64_t n, int prot) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)p & ~(page - 1), e = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    return mprotect((void *)a, e - a, prot) == 0;
}

/* Is w wholly inside f's bytes? */
static bool inside(const gguf_file *f, const mu_weight *w) {
    const uint64_t bytes = (uint64_t)w->n_out * w->row_bytes;
    return w->data >= f->base && w->data + bytes <= f->base + f->size;
}

void mu_repack_weights(gguf_file *f, mu_backend *be, mu_weight *const *ws, size_t n) {
    if (!f->mapped) return;
    /* First, so the repack below works on pages the process already owns. */
    if (be->wants_resident && be->wants_resident(be)) (void)gguf_make_resident(f);
    if (!be->wants_repack || !be->repack) return;
    /* A resident copy is made writable as a whole: changing the protection
     * of part of a huge page would split it into 4 KiB mappings. */
    const bool whole = f->resident && set_protection(f->base, f->span, PROT_READ | PROT_WRITE);
    /* A progress bar on a terminal once this takes a while (a device
     * backend uploads each weight in wants_repack; cpu repacks) */
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++) total += (uint64_t)ws[i]->n_out * ws[i]->row_bytes;
    const bool tty = isatty(STDERR_FILENO);
    char label[64];
    snprintf(label, sizeof label, "muser: weights for %s", be->name ? be->name : "the backend");
    const double t0 = mu_now();
    double drawn = -1;
    for (size_t i = 0; i < n; i++) {
        mu_weight *w = ws[i];
        const uint64_t bytes = (uint64_t)w->n_out * w->row_bytes;
        /* A refused mprotect leaves the weight zero-copy, which is correct. */
        if (be->wants_repack(be, w) && inside(f, w) &&
            (whole || set_protection(w->data, bytes, PROT_READ | PROT_WRITE))) {
            be->repack(be, w, (uint8_t *)(uintptr_t)w->data);
            if (!whole) set_protection(w->data, bytes, PROT_READ);
        }
        done += bytes;
        const double now = mu_now() - t0;
        if (tty && now > 0.5 && now - drawn > 0.1) {
            mu_progress_bar(label, done, total, now, false);
            drawn = now;
        }
    }
    if (drawn >= 0) mu_progress_bar(label, total, total, mu_now() - t0, true);
    if (whole) set_protection(f->base, f->span, PROT_READ);
}

void mu_hold_vectors(mu_backend *be, const float *const *vs, size_t k, int64_t n) {
    for (size_t i = 0; be->hold && i < k; i++)
        if (vs[i]) be->hold(be, vs[i], n);
}

void mu_model_repack(mu_model *m, mu_backend *be) {
    const size_t per_layer = 8;
    mu_weight **ws = mu_xcalloc((size_t)m->cfg.n_layer * per_layer + 1, sizeof *ws);
    size_t n = 0;
    for (int il = 0; il < m->cfg.n_layer; il++) {
        mu_layer_weights *l = &m->layers[il];
        mu_weight *lw[] = {&l->attn_q, &l->attn_k, &l->attn_v, &l->attn_gate, &l->attn_output,
                           &l->ffn_gate, &l->ffn_up, &l->ffn_down};
        for (size_t k = 0; k < sizeof lw / sizeof *lw; k++)
            if (lw[k]->data) ws[n++] = lw[k];
    }
    ws[n++] = &m->output;
    mu_repack_weights(m->gguf, be, ws, n);
    free(ws);
    for (int il = 0; il < m->cfg.n_layer; il++) {
        const mu_layer_weights *l = &m->layers[il];
        const float *e[] = {l->attn_norm, l->post_attention_norm, l->ffn_norm, l->post_ffw_norm};
        const float *d[] = {l->attn_q_norm, l->attn_k_norm};
        mu_hold_vectors(be, e, 4, m->cfg.n_embd);
        mu_hold_vectors(be, d, 2, m->cfg.head_dim);
    }
    mu_hold_vectors(be, (const float *[]){m->output_norm}, 1, m->cfg.n_embd);
}

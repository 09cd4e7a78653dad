/* mu_tokenize: special-token partition, then the model's tokenizer on every
 * raw fragment (llama_vocab::impl::tokenize). */
#include "tokenizer/tok_internal.h"
#include <stdlib.h>

/* The bytes the BPE and the regexes see for one raw fragment. The regexes
 * need valid UTF-8; llama.cpp replaces each invalid byte by U+FFFD. We keep
 * such a byte when the vocabulary has a token for it (so any byte string
 * round-trips) and let the regexes see DEL (0x7F) in its place: for every
 * supported pre-tokenizer DEL behaves exactly like U+FFFD (not a letter,
 * digit, whitespace or punctuation) and the offsets stay the same. A byte
 * without a token is replaced by U+FFFD as in llama.cpp. */
typedef struct frag_bytes {
    const char *raw, *clean;
    size_t n;
} frag_bytes;

static void prepare_fragment(const mu_tokenizer *t, const char *text, size_t n, frag_bytes *fb,
                             char **owned_raw, char **owned_clean) {
    const uint8_t *s = (const uint8_t *)text;
    size_t n_keep = 0, n_subst = 0;
    for (size_t i = 0; i < n;) {
        size_t k = s[i] < 0x80 ? 1 : tok_utf8_valid_len(s + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        if (t->byte_has_token[s[i++]]) n_keep++;
        else n_subst++;
    }
    *owned_raw = *owned_clean = NULL;
    *fb = (frag_bytes){text, text, n};
    if (!n_keep && !n_subst) return;
    size_t m = n + 2 * n_subst;
    char *raw = n_subst ? mu_xmalloc(m) : NULL, *clean = mu_xmalloc(m);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = s[i] < 0x80 ? 1 : tok_utf8_valid_len(s + i, n - i);
        if (k) {
            if (raw) memcpy(raw + o, s + i, k);
            memcpy(clean + o, s + i, k);
            o += k;
            i += k;
        } else if (t->byte_has_token[s[i]]) {
            if (raw) raw[o] = (char)s[i];
            clean[o++] = 0x7F;
            i++;
        } else {
            memcpy(raw + o, "\xef\xbf\xbd", 3);
            memcpy(clean + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *owned_raw = raw;
    *owned_clean = clean;
    *fb = (frag_bytes){raw ? raw : text, clean, m};
}

static bool tokenize_bpe(const mu_tokenizer *t, const char *text, const tok_fragment *frag,
                         size_t n_frag, tok_ids *out, mu_error *err) {
    tok_pre_state *ps = tok_pre_state_new(t->pre);
    tok_bpe_state *bs = tok_bpe_state_new();
    /* substituted fragments stay alive: the word cache points into them */
    char **owned = NULL;
    size_t n_owned = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n_frag; i++) {
        if (frag[i].token >= 0) {
            tok_ids_push(out, frag[i].token);
            continue;
        }
        frag_bytes fb;
        char *raw, *clean;
        prepare_fragment(t, text + frag[i].start, frag[i].len, &fb, &raw, &clean);
        ok = tok_bpe_fragment(t, ps, bs, fb.raw, fb.clean, fb.n, out, err);
        free(clean); /* the cache keys point into raw, never into clean */
        if (raw) {
            owned = mu_xrealloc(owned, (n_owned + 1) * sizeof *owned);
            owned[n_owned++] = raw;
        }
    }
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    tok_bpe_state_free(bs);
    tok_pre_state_free(ps);
    return ok;
}

static bool tokenize_spm(const mu_tokenizer *t, const char *text, const tok_fragment *frag,
                         size_t n_frag, tok_ids *out, mu_error *err) {
    bool prev_special = true; /* the first fragment gets the space prefix too */
    for (size_t i = 0; i < n_frag; i++) {
        if (frag[i].token >= 0) {
            tok_ids_push(out, frag[i].token);
            prev_special = true;
            continue;
        }
        if (!tok_spm_fragment(t, text + frag[i].start, frag[i].len,
                              t->add_space_prefix && prev_special, out, err))
            return false;
        prev_special = false;
    }
    return true;
}

int64_t mu_tokenize(const mu_tokenizer *t, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, mu_error *err) {
    *out = NULL;
    if (!text && len) {
        mu_err_set(err, "tokenize: NULL text with length %zu", len);
        return -1;
    }
    if (len > TOK_MAX_TEXT) { /* symbol indices are 32-bit */
        mu_err_set(err, "tokenize: text of %zu bytes exceeds the %u-byte limit", len,
                   TOK_MAX_TEXT);
        return -1;
    }
    if (add_special && ((t->add_bos && t->bos < 0) || (t->add_eos && t->eos < 0))) {
        mu_err_set(err, "tokenize: the model asks for %s but has no such token",
                   t->add_bos && t->bos < 0 ? "BOS" : "EOS");
        return -1;
    }
    size_t n_frag = 0;
    tok_fragment *frag = tok_special_partition(t, text, len, parse_special, &n_frag);
    tok_ids ids = {0};
    if (add_special && t->add_bos) tok_ids_push(&ids, t->bos);
    bool ok = t->kind == TOK_SPM ? tokenize_spm(t, text, frag, n_frag, &ids, err)
                                 : tokenize_bpe(t, text, frag, n_frag, &ids, err);
    free(frag);
    if (!ok) {
        free(ids.v);
        return -1;
    }
    if (add_special && t->add_eos) tok_ids_push(&ids, t->eos);
    *out = ids.v ? ids.v : mu_xmalloc(sizeof(int32_t));
    return (int64_t)ids.n;
}

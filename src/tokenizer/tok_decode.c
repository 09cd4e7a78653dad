/* Token -> bytes: the per-token piece cache (llama.cpp's token_to_piece with
 * special = true), whole-sequence detokenization with llama.cpp's
 * clean-up-spaces pass, and the streaming UTF-8-safe decoder. */
#include "tokenizer/tok_internal.h"
#include <stdio.h>
#include <stdlib.h>

/* ---------------- piece cache ---------------- */

/* llama.cpp's lenient UTF-8 reader: checks lead and continuation bits only;
 * anything else yields U+FFFD for one byte. */
static uint32_t lenient_cp(const uint8_t *s, size_t n, size_t *adv) {
    uint8_t c = s[0];
    size_t len = !(c & 0x80) ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3
               : !(c & 0x08) ? 4 : 0;
    bool ok = len > 0 && len <= n;
    for (size_t i = 1; ok && i < len; i++) ok = (s[i] & 0xC0) == 0x80;
    if (!ok) {
        *adv = 1;
        return 0xFFFD;
    }
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = c & lead_mask[len];
    for (size_t i = 1; i < len; i++) cp = cp << 6 | (s[i] & 0x3F);
    *adv = len;
    return cp > 0x10FFFF ? 0xFFFD : cp;
}

/* Byte-level text back to bytes (llama_decode_text), including llama.cpp's
 * "[UNK_BYTE_0x..]" marker for characters outside the GPT-2 alphabet. */
static void decode_bytelevel(tok_arena *a, const char *text, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t cp = lenient_cp(s + i, n - i, &adv);
        i += adv;
        int b = tok_cp_to_byte(cp);
        if (b >= 0) {
            char c = (char)b;
            tok_arena_append(a, &c, 1);
            continue;
        }
        char u[4], hex[4];
        size_t k = tok_utf8_encode(cp, u);
        tok_arena_append(a, "[UNK_BYTE_0x", 12);
        for (size_t j = 0; j < k; j++) {
            snprintf(hex, sizeof hex, "%02x", (uint8_t)u[j]);
            tok_arena_append(a, hex, 2);
        }
        tok_arena_append(a, text, n);
        tok_arena_append(a, "]", 1);
    }
}

/* The byte of a <0xNN> token (hex digits at [3, 5), as llama.cpp reads it). */
static uint8_t byte_token_value(const char *s, size_t n) {
    unsigned v = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + (unsigned)d;
    }
    return (uint8_t)v;
}

bool tok_pieces_build(mu_tokenizer *t, mu_error *err) {
    size_t n = (size_t)t->n_vocab;
    t->piece_off = mu_xmalloc(n * sizeof *t->piece_off);
    t->piece_len = mu_xmalloc(n * sizeof *t->piece_len);
    for (size_t id = 0; id < n; id++) {
        uint16_t attr = t->attr[id];
        const char *s = t->text.p + t->text_off[id];
        size_t len = t->text_len[id];
        tok_arena *a = &t->pieces;
        size_t start = a->len;
        if (attr & (MU_TOKEN_ATTR_UNKNOWN | MU_TOKEN_ATTR_CONTROL | MU_TOKEN_ATTR_USER_DEFINED)) {
            tok_arena_append(a, s, len);
        } else if (attr & MU_TOKEN_ATTR_NORMAL) {
            if (t->kind == TOK_SPM) {
                for (size_t i = 0; i < len; i++) {
                    if (i + 2 < len && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                        tok_arena_append(a, " ", 1);
                        i += 2;
                    } else {
                        tok_arena_append(a, s + i, 1);
                    }
                }
            } else {
                decode_bytelevel(a, s, len);
            }
        } else if (attr & MU_TOKEN_ATTR_BYTE) {
            char b = (char)byte_token_value(s, len);
            tok_arena_append(a, &b, 1);
        }
        /* unused / undefined tokens render as nothing */
        t->piece_off[id] = (uint32_t)start;
        t->piece_len[id] = (uint32_t)(a->len - start);
        tok_arena_append(a, "", 1); /* NUL-terminated like the texts */
        if (a->len > TOK_ARENA_LIMIT) {
            mu_err_set(err, "token pieces exceed %u bytes at token %zu", TOK_ARENA_LIMIT, id);
            return false;
        }
    }
    return true;
}

/* Piece bytes as llama_token_to_piece renders them. */
static const char *piece(const mu_tokenizer *t, int32_t id, bool special, size_t *len) {
    if (!special && (t->attr[id] & (MU_TOKEN_ATTR_UNKNOWN | MU_TOKEN_ATTR_CONTROL))) {
        *len = 0;
        return "";
    }
    *len = t->piece_len[id];
    return t->pieces.p + t->piece_off[id];
}

size_t mu_token_to_piece(const mu_tokenizer *t, int32_t id, bool render_special, char *buf,
                         size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    size_t len;
    const char *p = piece(t, id, render_special, &len);
    if (buf) memcpy(buf, p, len < cap ? len : cap);
    return len;
}

/* ---------------- whole-sequence detokenization ---------------- */

/* llama_detokenize's three clean-up passes over the joined text. */
static size_t clean_spaces(char *text, size_t total) {
    size_t t1 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t1; i++) { /* " ?", " !", " .", " ," */
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        text[total++] = x;
    }
    size_t t2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t2; i++) { /* " ' " -> "'" */
        char x = text[i];
        if (x == '\'' && i + 1 < t2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    size_t t3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t3; i++) { /* " 's", " 'm", " 're", " 've" */
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') total--;
            else if (i + 2 < t3 && ((x1 == 'r' && text[i + 2] == 'e') ||
                                    (x1 == 'v' && text[i + 2] == 'e')))
                total--;
        }
        text[total++] = x;
    }
    return total;
}

char *mu_detokenize(const mu_tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                    bool unparse_special, size_t *len, mu_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            mu_err_set(err, "detokenize: token %zu has id %d, outside the vocabulary (0..%lld)",
                       i, ids[i], (long long)t->n_vocab - 1);
            return NULL;
        }
    }
    bool strip = t->add_space_prefix;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
        strip = false;
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += t->piece_len[ids[i]];
    char *out = mu_xmalloc(total + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = piece(t, ids[i], unparse_special, &pl);
        if (strip && pl && p[0] == ' ') p++, pl--;
        strip = false;
        memcpy(out + o, p, pl);
        o += pl;
    }
    if (t->clean_spaces) o = clean_spaces(out, o);
    out[o] = '\0';
    if (len) *len = o;
    return out;
}

/* ---------------- streaming ---------------- */

void mu_detok_init(mu_detok *d, const mu_tokenizer *t, unsigned flags) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->flags = flags;
    d->strip_next = (flags & MU_DETOK_SEQ_START) && t->add_space_prefix;
}

void mu_detok_free(mu_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}

static void reserve(mu_detok *d, size_t n) {
    if (n <= d->cap) return;
    size_t cap = d->cap ? d->cap : 64;
    while (cap < n) cap *= 2;
    d->buf = mu_xrealloc(d->buf, cap);
    d->cap = cap;
}

static size_t put_invalid(const mu_detok *d, char *o, uint8_t b) {
    if (d->flags & MU_DETOK_RAW_INVALID) {
        *o = (char)b;
        return 1;
    }
    memcpy(o, "\xef\xbf\xbd", 3);
    return 3;
}

/* Emit every complete sequence of pend + p; keep a valid incomplete tail. */
static size_t drain(mu_detok *d, const uint8_t *p, size_t n, bool final) {
    size_t total = d->n_pend + n;
    uint8_t *in = mu_xmalloc(total ? total : 1);
    memcpy(in, d->pend, d->n_pend);
    if (n) memcpy(in + d->n_pend, p, n);
    reserve(d, 3 * total + 1);
    size_t o = 0, i = 0;
    d->n_pend = 0;
    while (i < total) {
        size_t k = tok_utf8_valid_len(in + i, total - i);
        if (k) {
            memcpy(d->buf + o, in + i, k);
            o += k;
            i += k;
        } else if (!final && tok_utf8_is_valid_prefix(in + i, total - i)) {
            memcpy(d->pend, in + i, total - i); /* at most 3 bytes */
            d->n_pend = total - i;
            break;
        } else {
            o += put_invalid(d, d->buf + o, in[i]);
            i++;
        }
    }
    d->buf[o] = '\0';
    free(in);
    return o;
}

const char *mu_detok_push(mu_detok *d, int32_t id, size_t *len) {
    size_t dummy;
    if (!len) len = &dummy;
    *len = 0;
    if (id < 0 || id >= d->tok->n_vocab) return NULL;
    size_t pl;
    const char *p = piece(d->tok, id, d->flags & MU_DETOK_SPECIAL, &pl);
    if (d->strip_next && pl && p[0] == ' ') p++, pl--;
    d->strip_next = false;
    *len = drain(d, (const uint8_t *)p, pl, false);
    return d->buf;
}

const char *mu_detok_flush(mu_detok *d, size_t *len) {
    size_t n = drain(d, NULL, 0, true);
    if (len) *len = n;
    return d->buf;
}

/* The synthetic model's tokenizer: byte-level GPT-2 BPE (256 byte tokens,
 * a few dozen English merges), Llama-4-style special tokens, reserved
 * control tokens up to the vocab size, and a small Llama-4-style template. */
#include "tools/synth_internal.h"
#include <stdio.h>
#include <stdlib.h>

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3 };

/* Merges as raw byte strings, highest priority first. Every part is a byte
 * or the result of an earlier merge (checked when the vocab is built). */
static const char *const MERGES[][2] = {
    {" ", "t"}, {" ", "a"}, {"h", "e"}, {"i", "n"}, {"r", "e"}, {"o", "n"},
    {" t", "he"}, {"e", "r"}, {" ", "s"}, {"a", "t"}, {" ", "w"}, {" ", "o"},
    {"e", "n"}, {" ", "c"}, {"i", "t"}, {"i", "s"}, {"a", "n"}, {"o", "r"},
    {"e", "s"}, {" ", "b"}, {"e", "d"}, {" ", "f"}, {"in", "g"}, {" ", "p"},
    {"o", "u"}, {" a", "n"}, {"a", "l"}, {"a", "r"}, {" t", "o"}, {" ", "m"},
    {" o", "f"}, {" ", "in"}, {" ", "d"}, {" ", "h"}, {" an", "d"}, {"i", "c"},
    {"a", "s"}, {"l", "e"}, {" t", "h"}, {"i", "on"}, {"o", "m"}, {"l", "l"},
    {"en", "t"}, {" ", "n"}, {" ", "l"}, {"s", "t"}, {" ", "re"}, {"v", "e"},
    {" ", "e"}, {"r", "o"}, {"l", "y"}, {" b", "e"}, {" ", "g"}, {" ", "T"},
    {"c", "t"}, {" ", "y"}, {" ", "is"}, {" ", "I"}, {"\n", "\n"}, {" w", "h"},
};
#define N_MERGES (sizeof MERGES / sizeof MERGES[0])

static const char *const SPECIALS[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot|>",
    "<|header_start|>", "<|header_end|>", "<|mask|>",
};
#define N_SPECIALS (sizeof SPECIALS / sizeof SPECIALS[0])

static const char CHAT_TEMPLATE[] =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' + message['content'] | trim + '<|eot|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}\n"
    "{%- endif %}\n";

uint64_t mu_synth_vocab_min_size(void) {
    return 256 + N_MERGES + N_SPECIALS;
}

/* GPT-2 byte-to-unicode: printable Latin-1 bytes map to themselves, the
 * rest to U+0100 upwards in byte order (space -> U+0120 'Ġ'). */
static uint32_t byte_codepoint(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

/* Byte-level form of raw bytes, UTF-8 encoded (every code point < 0x800). */
static char *byte_level(const char *raw) {
    size_t n = strlen(raw);
    char *out = mu_xmalloc(2 * n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_codepoint((uint8_t)raw[i]);
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xC0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *o = '\0';
    return out;
}

static char *byte_level_byte(uint8_t b) {
    char raw[2] = {(char)b, 0};
    if (b == 0) { /* NUL cannot travel in a C string: encode U+0100 directly */
        char *s = mu_xmalloc(3);
        s[0] = (char)0xC4; s[1] = (char)0x80; s[2] = 0;
        return s;
    }
    return byte_level(raw);
}

static bool has_token(const mu_synth_vocab *v, const char *s) {
    for (uint64_t i = 0; i < v->n; i++)
        if (!strcmp(v->tokens[i], s)) return true;
    return false;
}

static void push_token(mu_synth_vocab *v, char *s, int32_t type) {
    v->tokens[v->n] = s;
    v->types[v->n] = type;
    v->n++;
}

bool mu_synth_vocab_build(uint64_t n_vocab, mu_synth_vocab *v, mu_error *err) {
    memset(v, 0, sizeof *v);
    if (n_vocab < mu_synth_vocab_min_size() || n_vocab > (1ull << 31)) {
        mu_err_set(err, "vocab size %llu is out of range (synth needs %llu..%llu)",
                   (unsigned long long)n_vocab, (unsigned long long)mu_synth_vocab_min_size(),
                   1ull << 31);
        return false;
    }
    v->tokens = mu_xcalloc(n_vocab, sizeof *v->tokens);
    v->types = mu_xcalloc(n_vocab, sizeof *v->types);
    v->merges = mu_xcalloc(N_MERGES, sizeof *v->merges);
    for (int b = 0; b < 256; b++) push_token(v, byte_level_byte((uint8_t)b), TOKEN_NORMAL);
    for (size_t i = 0; i < N_MERGES; i++) {
        char *l = byte_level(MERGES[i][0]), *r = byte_level(MERGES[i][1]);
        size_t nl = strlen(l), nr = strlen(r);
        char *merged = mu_xmalloc(nl + nr + 1), *rule = mu_xmalloc(nl + nr + 2);
        memcpy(merged, l, nl);
        memcpy(merged + nl, r, nr + 1);
        memcpy(rule, l, nl);
        rule[nl] = ' ';
        memcpy(rule + nl + 1, r, nr + 1);
        bool ok = has_token(v, l) && has_token(v, r) && !has_token(v, merged);
        free(l);
        free(r);
        if (!ok) { /* a bug in MERGES, not in user input */
            mu_err_set(err, "internal: synth merge %zu '%s' has a missing part or a duplicate result",
                       i, rule);
            free(merged);
            free(rule);
            mu_synth_vocab_free(v);
            return false;
        }
        v->merges[v->n_merges++] = rule;
        push_token(v, merged, TOKEN_NORMAL);
    }
    uint64_t first_special = v->n;
    for (size_t i = 0; i < N_SPECIALS; i++) push_token(v, mu_xstrdup(SPECIALS[i]), TOKEN_CONTROL);
    v->bos = (uint32_t)first_special;
    v->eos = (uint32_t)first_special + 1;
    v->eot = (uint32_t)first_special + 2;
    v->mask = (uint32_t)first_special + 5;
    for (uint64_t k = 0; v->n < n_vocab; k++) {
        char buf[64];
        snprintf(buf, sizeof buf, "<|reserved_special_token_%llu|>", (unsigned long long)k);
        push_token(v, mu_xstrdup(buf), TOKEN_CONTROL);
    }
    return true;
}

void mu_synth_vocab_write(const mu_synth_vocab *v, gguf_writer *w) {
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama4");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->types, v->n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v->bos);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", v->eos);
    gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", v->eot);
    gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", v->mask);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", CHAT_TEMPLATE);
}

void mu_synth_vocab_free(mu_synth_vocab *v) {
    for (uint64_t i = 0; i < v->n; i++) free(v->tokens[i]);
    for (uint64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

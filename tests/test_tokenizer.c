/* Tokenizers against llama.cpp's vocabulary test data (every case of every
 * GGUF in tests/data/tokenizer must match exactly), detokenization round
 * trips, the streaming decoder's UTF-8 safety, special-token parsing, EOG
 * sets, refusal of unknown pre-tokenizers, and the synthesized Muse Glimmer
 * vocabulary. Prints the tokenizer throughput (not a timed assertion). */
#include "testutil.h"
#include "gguf/gguf.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"
#include "tools/tools.h"
#include <pthread.h>
#include <unistd.h>

/* ---------------- helpers ---------------- */

static char g_data_dir[1024];

static void find_data_dir(void) { tu_data_dir(g_data_dir, sizeof g_data_dir, "tokenizer", __FILE__); }

typedef struct vocab {
    gguf_file *f;
    mu_tokenizer *t;
} vocab;

static bool open_vocab(const char *name, vocab *v) {
    char path[1200];
    mu_error err = {{0}};
    snprintf(path, sizeof path, "%s/%s.gguf", g_data_dir, name);
    v->f = gguf_open(path, &err);
    v->t = v->f ? mu_tokenizer_load(v->f, &err) : NULL;
    CHECK_MSG(v->t != NULL, "%s: %s", name, err.msg);
    return v->t != NULL;
}

static void close_vocab(vocab *v) {
    mu_tokenizer_free(v->t);
    gguf_close(v->f);
}

static int64_t tokenize(const mu_tokenizer *t, const char *s, size_t n, bool add_special,
                        bool parse_special, int32_t **ids) {
    mu_error err = {{0}};
    int64_t k = mu_tokenize(t, s, n, add_special, parse_special, ids, &err);
    CHECK_MSG(k >= 0, "tokenize failed: %s", err.msg);
    return k;
}

/* Test-side UTF-8 validator (independent of tok_utf8.c). */
static bool valid_utf8(const char *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i], need, cp, min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC0 && c < 0xE0) need = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c < 0xF0) need = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c < 0xF8) need = 3, cp = c & 0x07, min = 0x10000;
        else return false;
        if (i + need >= n) return false; /* truncated */
        for (uint32_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
        i += need + 1;
    }
    return true;
}

/* Push ids one by one; every chunk must be valid UTF-8. */
static char *stream_checked(const mu_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                            size_t *len) {
    mu_detok d;
    mu_detok_init(&d, t, flags);
    size_t cap = 64, o = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *p = i < n ? mu_detok_push(&d, ids[i], &k) : mu_detok_flush(&d, &k);
        if (!p) break;
        CHECK_MSG(valid_utf8(p, k), "chunk %zu of %zu is not valid UTF-8", i, n);
        while (o + k + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + o, p, k);
        o += k;
    }
    mu_detok_free(&d);
    out[o] = '\0';
    *len = o;
    return out;
}

/* ---------------- llama.cpp test data ---------------- */

/* Cases are separated by "\n__ggml_vocab_test__\n"; a trailing separator
 * ends the list. Expected ids: one line per case. */
static void run_vocab_file(const char *name, bool roundtrip, unsigned detok_flags) {
    char path[1200];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, "%s/%s.gguf.inp", g_data_dir, name);
    char *inp = tu_read_file(path, &inp_len);
    snprintf(path, sizeof path, "%s/%s.gguf.out", g_data_dir, name);
    char *outp = tu_read_file(path, &out_len);
    CHECK_MSG(inp && outp, "missing test data for %s in %s", name, g_data_dir);
    vocab v;
    if (!inp || !outp || !open_vocab(name, &v)) {
        free(inp);
        free(outp);
        return;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sep_len = strlen(sep), pos = 0;
    char *line = outp, *save = NULL;
    int n_cases = 0, n_pass = 0, n_rt = 0, n_rt_pass = 0;
    while (pos < inp_len) {
        const char *next = strstr(inp + pos, sep);
        size_t case_len = next ? (size_t)(next - (inp + pos)) : inp_len - pos;
        const char *text = inp + pos;
        pos = next ? (size_t)(next - inp) + sep_len : inp_len;
        /* expected line (may be empty) */
        char *eol = line ? strchr(line, '\n') : NULL;
        if (!line || !*line) {
            CHECK_MSG(false, "%s: fewer output lines than cases", name);
            break;
        }
        if (eol) *eol = '\0';
        int32_t want[4096];
        int n_want = 0;
        for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            if (n_want < 4096) want[n_want++] = atoi(tok);
        line = eol ? eol + 1 : NULL;

        int32_t *ids = NULL;
        int64_t k = tokenize(v.t, text, case_len, false, false, &ids);
        bool same = k == n_want;
        for (int64_t i = 0; same && i < k; i++) same = ids[i] == want[i];
        n_cases++;
        n_pass += same;
        if (!same) {
            fprintf(stderr, "%s case %d '%.*s':\n  want", name, n_cases - 1, (int)case_len, text);
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got ");
            for (int64_t i = 0; i < k; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        if (roundtrip && k >= 0) {
            size_t n;
            char *back = stream_checked(v.t, ids, (size_t)k, detok_flags, &n);
            bool ok = n == case_len && !memcmp(back, text, n);
            n_rt++;
            n_rt_pass += ok;
            CHECK_MSG(ok, "%s case %d: detokenized '%s' != '%.*s'", name, n_cases - 1, back,
                      (int)case_len, text);
            free(back);
        }
        free(ids);
    }
    CHECK_MSG(n_cases == n_pass, "%s: %d of %d cases differ", name, n_cases - n_pass, n_cases);
    CHECK(n_cases > 0);
    printf("%-28s %s/%s  %d/%d cases", name, mu_tokenizer_model(v.t), mu_tokenizer_pre(v.t),
           n_pass, n_cases);
    if (roundtrip) printf(", round trip %d/%d", n_rt_pass, n_rt);
    printf("\n");
    close_vocab(&v);
    free(inp);
    free(outp);
}

static void test_vocab_files(void) {
    run_vocab_file("ggml-vocab-gpt-2", true, MU_DETOK_SPECIAL | MU_DETOK_RAW_INVALID);
    run_vocab_file("ggml-vocab-falcon", true, MU_DETOK_SPECIAL | MU_DETOK_RAW_INVALID);
    run_vocab_file("ggml-vocab-starcoder", true, MU_DETOK_SPECIAL | MU_DETOK_RAW_INVALID);
    run_vocab_file("ggml-vocab-deepseek-coder", true, MU_DETOK_SPECIAL | MU_DETOK_RAW_INVALID);
    run_vocab_file("ggml-vocab-llama-spm", true,
                   MU_DETOK_SPECIAL | MU_DETOK_SEQ_START | MU_DETOK_RAW_INVALID);
    run_vocab_file("ggml-vocab-phi-3", true,
                   MU_DETOK_SPECIAL | MU_DETOK_SEQ_START | MU_DETOK_RAW_INVALID);
}

/* ---------------- byte table and UTF-8 ---------------- */

/* GPT-2's bytes_to_unicode, built the way the original describes it. */
static void test_byte_table(void) {
    uint32_t cp[256];
    bool printable[256] = {false};
    for (int b = '!'; b <= '~'; b++) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) printable[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) cp[b] = printable[b] ? (uint32_t)b : 256 + n++;
    for (int b = 0; b < 256; b++) {
        CHECK_EQ_INT(tok_byte_to_cp((uint8_t)b), cp[b]);
        CHECK_EQ_INT(tok_cp_to_byte(cp[b]), b);
    }
    CHECK_EQ_INT(tok_byte_to_cp(' '), 0x120);
    CHECK_EQ_INT(tok_cp_to_byte(0x144), -1);
    CHECK_EQ_INT(tok_cp_to_byte(0xAD), -1);
    char raw[8];
    CHECK_EQ_INT(tok_bytelevel_decode("\xc4\xa0hi", 4, raw), 3); /* "Ġhi" */
    CHECK(!memcmp(raw, " hi", 3));
    CHECK_EQ_INT(tok_bytelevel_decode("\xe2\x96\x81", 3, raw), -1);
}

static void test_utf8_rules(void) {
    static const struct { const char *s; size_t n, want; } cases[] = {
        {"a", 1, 1}, {"\xc3\xa9", 2, 2}, {"\xe2\x82\xac", 3, 3}, {"\xf0\x9f\xa6\x99", 4, 4},
        {"\xc0\x80", 2, 0},         /* overlong */
        {"\xc1\xbf", 2, 0},         /* overlong */
        {"\xe0\x80\x80", 3, 0},     /* overlong */
        {"\xed\xa0\x80", 3, 0},     /* surrogate */
        {"\xf4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0}, {"\x80", 1, 0}, {"\xff", 1, 0},
        {"\xf0\x9f\xa6", 3, 0},     /* truncated */
        {"\xe2\x28\xa1", 3, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_EQ_INT(tok_utf8_valid_len((const uint8_t *)cases[i].s, cases[i].n), cases[i].want);
    CHECK(tok_utf8_is_valid_prefix((const uint8_t *)"\xf0\x9f\xa6", 3));
    CHECK(tok_utf8_is_valid_prefix((const uint8_t *)"\xe2", 1));
    CHECK(!tok_utf8_is_valid_prefix((const uint8_t *)"\xed\xa0", 2));
    CHECK(!tok_utf8_is_valid_prefix((const uint8_t *)"\xc0", 1));
    CHECK(!tok_utf8_is_valid_prefix((const uint8_t *)"\xf0\x9f\xa6\x99", 4));
}

/* ---------------- streaming decoder ---------------- */

static const char LLAMA_EMOJI[] = "\xf0\x9f\xa6\x99"; /* U+1F999, no token of its own */

static void test_stream_spm_bytes(void) {
    vocab v;
    if (!open_vocab("ggml-vocab-llama-spm", &v)) return;
    int32_t *ids = NULL;
    int64_t k = tokenize(v.t, LLAMA_EMOJI, 4, false, false, &ids);
    /* "▁" then the four byte-fallback tokens <0xF0> <0x9F> <0xA6> <0x99> */
    CHECK_EQ_INT(k, 5);
    if (k == 5) {
        CHECK_EQ_INT(ids[1], mu_tokenizer_find(v.t, "<0xF0>", 6));
        CHECK(mu_token_attr(v.t, ids[4]) & MU_TOKEN_ATTR_BYTE);
        mu_detok d;
        mu_detok_init(&d, v.t, MU_DETOK_SEQ_START);
        size_t n;
        mu_detok_push(&d, ids[0], &n);
        CHECK_EQ_INT(n, 0); /* the leading space of the sequence is dropped */
        for (int i = 1; i < 4; i++) {
            mu_detok_push(&d, ids[i], &n);
            CHECK_EQ_INT(n, 0); /* held back: incomplete code point */
        }
        const char *p = mu_detok_push(&d, ids[4], &n);
        CHECK(n == 4 && !memcmp(p, LLAMA_EMOJI, 4));
        mu_detok_flush(&d, &n);
        CHECK_EQ_INT(n, 0);
        mu_detok_free(&d);
        /* an unfinished sequence at the end: U+FFFD per byte, or raw */
        for (unsigned flags = 0; flags <= MU_DETOK_RAW_INVALID; flags += MU_DETOK_RAW_INVALID) {
            mu_detok_init(&d, v.t, flags);
            mu_detok_push(&d, ids[1], &n);
            mu_detok_push(&d, ids[2], &n);
            CHECK_EQ_INT(n, 0);
            p = mu_detok_flush(&d, &n);
            if (flags) CHECK(n == 2 && !memcmp(p, "\xf0\x9f", 2));
            else CHECK(n == 6 && !memcmp(p, "\xef\xbf\xbd\xef\xbf\xbd", 6));
            mu_detok_free(&d);
        }
        /* a byte that can never start UTF-8 is not held back */
        mu_detok_init(&d, v.t, 0);
        p = mu_detok_push(&d, mu_tokenizer_find(v.t, "<0xFF>", 6), &n);
        CHECK(n == 3 && !memcmp(p, "\xef\xbf\xbd", 3));
        p = mu_detok_push(&d, (int32_t)mu_tokenizer_n_vocab(v.t), &n);
        CHECK(p == NULL && n == 0);
        mu_detok_free(&d);
    }
    free(ids);
    close_vocab(&v);
}

static void test_stream_bytelevel(void) {
    vocab v;
    if (!open_vocab("ggml-vocab-gpt-2", &v)) return;
    const char *text = "Hi \xf0\x9f\xa6\x99"
                       "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f ok";
    int32_t *ids = NULL;
    int64_t k = tokenize(v.t, text, strlen(text), false, false, &ids);
    /* the emoji spans several byte-level tokens, none of them a whole code point */
    int partial = 0;
    for (int64_t i = 0; i < k; i++) {
        char piece[64];
        size_t n = mu_token_to_piece(v.t, ids[i], false, piece, sizeof piece);
        partial += !valid_utf8(piece, n);
    }
    CHECK(partial >= 2);
    size_t n;
    char *back = stream_checked(v.t, ids, (size_t)k, 0, &n);
    CHECK(n == strlen(text) && !memcmp(back, text, n));
    free(back);
    free(ids);
    close_vocab(&v);
}

/* ---------------- special tokens ---------------- */

static bool contains(const int32_t *ids, int64_t n, int32_t id) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static void test_parse_special(void) {
    vocab v;
    int32_t *a = NULL, *b = NULL;
    int64_t na, nb;
    if (open_vocab("ggml-vocab-gpt-2", &v)) {
        const char *s = "a<|endoftext|>b";
        na = tokenize(v.t, s, strlen(s), false, false, &a);
        nb = tokenize(v.t, s, strlen(s), false, true, &b);
        CHECK(!contains(a, na, 50256) && na > 3);
        CHECK(nb == 3 && b[0] == 64 && b[1] == 50256 && b[2] == 65);
        char piece[32];
        CHECK_EQ_INT(mu_token_to_piece(v.t, 50256, false, piece, sizeof piece), 0);
        CHECK_EQ_INT(mu_token_to_piece(v.t, 50256, true, piece, sizeof piece), 13);
        CHECK(!memcmp(piece, "<|endoftext|>", 13));
        free(a);
        free(b);
        close_vocab(&v);
    }
    if (open_vocab("ggml-vocab-llama-spm", &v)) {
        const char *s = "<s>hi</s>";
        int32_t *hi = NULL;
        int64_t nhi = tokenize(v.t, "hi", 2, false, false, &hi); /* "▁hi" */
        na = tokenize(v.t, s, strlen(s), false, false, &a);
        nb = tokenize(v.t, s, strlen(s), false, true, &b);
        CHECK(!contains(a, na, 1) && !contains(a, na, 2));
        CHECK(nb == nhi + 2 && b[0] == 1 && b[nb - 1] == 2);
        CHECK(nb == nhi + 2 && !memcmp(b + 1, hi, (size_t)nhi * sizeof *hi));
        free(a);
        free(b);
        /* add_special: BOS first */
        na = tokenize(v.t, "hi", 2, true, false, &a);
        CHECK(na == nhi + 1 && a[0] == 1);
        free(a);
        free(hi);
        close_vocab(&v);
    }
    if (open_vocab("ggml-vocab-phi-3", &v)) {
        /* phi-3's control tokens are RSTRIP: the whitespace after them goes */
        int32_t user = mu_tokenizer_find(v.t, "<|user|>", 8);
        CHECK(user > 0 && mu_token_is_control(v.t, user));
        CHECK(mu_token_attr(v.t, user) & MU_TOKEN_ATTR_RSTRIP);
        const char *s = "<|user|>  \n Hello";
        int32_t *hello = NULL;
        int64_t nh = tokenize(v.t, "Hello", 5, false, false, &hello);
        na = tokenize(v.t, s, strlen(s), false, false, &a);
        nb = tokenize(v.t, s, strlen(s), false, true, &b);
        CHECK(!contains(a, na, user));
        CHECK(nb == nh + 1 && b[0] == user);
        CHECK(nb == nh + 1 && !memcmp(b + 1, hello, (size_t)nh * sizeof *b));
        free(a);
        free(b);
        free(hello);
        close_vocab(&v);
    }
    if (open_vocab("ggml-vocab-deepseek-coder", &v)) {
        /* user-defined tokens split out even without parse_special */
        int32_t ud = mu_tokenizer_find(v.t, "\xc3\xb5", 2); /* user-defined "õ" */
        CHECK(ud >= 0 && (mu_token_attr(v.t, ud) & MU_TOKEN_ATTR_USER_DEFINED));
        na = tokenize(v.t, "a\xc3\xb5" "b", 4, false, false, &a);
        CHECK(contains(a, na, ud));
        free(a);
        close_vocab(&v);
    }
}

/* ---------------- fail-closed loading ---------------- */

static char g_tmp[256];

static char *tmp_path(const char *name) {
    static char bufs[4][512];
    static int k;
    char *b = bufs[k++ % 4];
    snprintf(b, 512, "%s/%s", g_tmp, name);
    return b;
}

typedef struct tiny_opts {
    const char *model, *pre;     /* NULL: key omitted */
    int64_t eos;                 /* -1: key omitted */
    bool duplicate, int_tokens, short_types;
} tiny_opts;

/* A small byte-level vocabulary: 256 byte tokens, three merges, a control
 * token "<|eot|>". */
static char *write_tiny(const char *name, tiny_opts o) {
    enum { N = 260 };
    char *texts[N];
    int32_t types[N];
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t k = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), u);
        texts[b] = strndup(u, k);
        types[b] = 1;
    }
    texts[256] = strdup("he");
    texts[257] = strdup("\xc4\xa0the"); /* "Ġthe" */
    texts[258] = strdup(o.duplicate ? "he" : "\xc4\xa0t");
    texts[259] = strdup("<|eot|>");
    types[256] = types[257] = types[258] = 1;
    types[259] = 3;
    const char *merges[] = {"h e", "\xc4\xa0 t", "\xc4\xa0t he"};
    gguf_writer *w = gguf_writer_new();
    if (o.model) gguf_writer_set_str(w, "tokenizer.ggml.model", o.model);
    if (o.pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", o.pre);
    if (o.int_tokens) gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_VT_INT32, types, N);
    else gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts, N);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                        o.short_types ? N - 1 : N);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 3);
    if (o.eos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)o.eos);
    char *path = tmp_path(name);
    mu_error err;
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    for (int i = 0; i < N; i++) free(texts[i]);
    return path;
}

/* Load path; expect failure with `needle` in the message (NULL: success). */
static mu_tokenizer *try_load(const char *path, const char *needle, gguf_file **fout) {
    mu_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    mu_tokenizer *t = f ? mu_tokenizer_load(f, &err) : NULL;
    if (needle) {
        CHECK_MSG(t == NULL, "%s loaded, expected an error with '%s'", path, needle);
        CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
        mu_tokenizer_free(t);
        t = NULL;
    }
    if (fout && t) *fout = f;
    else gguf_close(f);
    return t;
}

static void test_refusals(void) {
    tiny_opts base = {.model = "gpt2", .pre = "llama4", .eos = 259};
    tiny_opts o = base;
    gguf_file *f = NULL;
    mu_tokenizer *t = try_load(write_tiny("ok.gguf", o), NULL, &f);
    CHECK(t != NULL);
    if (t) {
        int32_t *ids = NULL;
        int64_t k = tokenize(t, " the he", 7, false, false, &ids);
        CHECK(k == 3 && ids[0] == 257 && ids[1] == 32 && ids[2] == 256); /* "Ġthe" "Ġ" "he" */
        CHECK(mu_token_is_eog(t, 259) && mu_token_is_control(t, 259));
        free(ids);
        mu_tokenizer_free(t);
        gguf_close(f);
    }
    /* "<|eot|>" ends generation by its text alone (Llama-4 / Muse Glimmer) */
    o = base, o.eos = -1;
    t = try_load(write_tiny("noeos.gguf", o), NULL, &f);
    CHECK(t && mu_token_is_eog(t, 259) && mu_token_is_control(t, 259));
    mu_tokenizer_free(t);
    if (t) gguf_close(f);
    o = base, o.pre = "bogus-pre-xyz";
    try_load(write_tiny("pre.gguf", o), "bogus-pre-xyz", NULL);
    o = base, o.model = "bert";
    try_load(write_tiny("model.gguf", o), "'bert'", NULL);
    o = base, o.model = NULL;
    try_load(write_tiny("nomodel.gguf", o), "tokenizer.ggml.model", NULL);
    o = base, o.eos = 260;
    try_load(write_tiny("eos.gguf", o), "tokenizer.ggml.eos_token_id", NULL);
    o = base, o.duplicate = true;
    try_load(write_tiny("dup.gguf", o), "repeats token 256", NULL);
    o = base, o.int_tokens = true;
    try_load(write_tiny("ints.gguf", o), "tokenizer.ggml.tokens", NULL);
    o = base, o.short_types = true;
    try_load(write_tiny("types.gguf", o), "tokenizer.ggml.token_type", NULL);
    /* no pre: llama.cpp's "default" */
    o = base, o.pre = NULL;
    t = try_load(write_tiny("nopre.gguf", o), NULL, &f);
    CHECK(t && !strcmp(mu_tokenizer_pre(t), "default"));
    mu_tokenizer_free(t);
    if (t) gguf_close(f);
}

/* ---------------- EOG sets ---------------- */

static void check_eog(const char *name, const int32_t *want, size_t n_want) {
    vocab v;
    if (!open_vocab(name, &v)) return;
    const int32_t *ids;
    size_t n = mu_tokenizer_eog_ids(v.t, &ids);
    CHECK_MSG(n == n_want, "%s: %zu EOG tokens, want %zu", name, n, n_want);
    for (size_t i = 0; i < n && i < n_want; i++) {
        CHECK_EQ_INT(ids[i], want[i]);
        CHECK(mu_token_is_eog(v.t, want[i]));
    }
    CHECK(!mu_token_is_eog(v.t, 100));
    close_vocab(&v);
}

static void test_eog(void) {
    check_eog("ggml-vocab-gpt-2", (const int32_t[]){50256}, 1);
    check_eog("ggml-vocab-llama-spm", (const int32_t[]){2}, 1);
    /* phi-3: eos <|endoftext|>, "</s>" and "<|end|>" by text (as llama.cpp) */
    check_eog("ggml-vocab-phi-3", (const int32_t[]){2, 32000, 32007}, 3);
    /* starcoder: <|endoftext|> and the FIM pad token */
    check_eog("ggml-vocab-starcoder", (const int32_t[]){0, 4}, 2);
}

/* ---------------- synthesized Muse Glimmer vocabulary ---------------- */

static void test_synth(void) {
    mu_synth_opts o;
    mu_synth_opts_init(&o);
    o.out_path = tmp_path("synth.gguf");
    o.n_threads = 2;
    mu_error err = {{0}};
    CHECK_MSG(mu_synth(&o, &err), "%s", err.msg);
    gguf_file *f = NULL;
    mu_tokenizer *t = try_load(o.out_path, NULL, &f);
    if (!t) return;
    CHECK(!strcmp(mu_tokenizer_pre(t), "llama4") && !strcmp(mu_tokenizer_model(t), "gpt2"));
    int32_t eos = mu_tokenizer_find(t, "<|end_of_text|>", 15);
    int32_t eot = mu_tokenizer_find(t, "<|eot|>", 7);
    CHECK(eos >= 0 && eot >= 0 && mu_token_eos(t) == eos && mu_token_eot(t) == eot);
    const int32_t *eog;
    CHECK_EQ_INT(mu_tokenizer_eog_ids(t, &eog), 2); /* the two end tokens, nothing else */
    CHECK(mu_token_is_eog(t, eos) && mu_token_is_eog(t, eot));
    CHECK(!mu_token_is_eog(t, mu_token_bos(t)) && mu_tokenizer_add_bos(t));

    /* round trip of random byte strings: text, emoji, specials, invalid bytes */
    static const char *const parts[] = {
        "The", " quick", " brown", " fox", "'s", " ", "  ", "\n", "\n\n", "\t", "123456",
        "\xf0\x9f\xa6\x99", "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f",
        "\xe4\xb8\xad\xe6\x96\x87", "\xd0\x9f\xd1\x80\xd0\xb8", "e\xcc\x81", "<|eot|>",
        "<|begin_of_text|>", "<|header_start|>user<|header_end|>", "?!", "\xc2\xa0",
    };
    uint64_t rng = 0x1234567;
    for (int c = 0; c < 300; c++) {
        char buf[512];
        size_t n = 0;
        int k = 1 + (int)(tu_rng_next(&rng) % 12);
        for (int j = 0; j < k; j++) {
            if (tu_rng_next(&rng) % 5 == 0) {
                buf[n++] = (char)(0x80 + tu_rng_next(&rng) % 128); /* lone invalid byte */
                continue;
            }
            const char *p = parts[tu_rng_next(&rng) % (sizeof parts / sizeof parts[0])];
            memcpy(buf + n, p, strlen(p));
            n += strlen(p);
        }
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            int64_t m = tokenize(t, buf, n, true, special, &ids);
            CHECK(m >= 1 && ids[0] == mu_token_bos(t));
            size_t len = 0;
            char *back = mu_detokenize(t, ids, (size_t)m, true, special, &len, &err);
            CHECK_MSG(back && len == n && !memcmp(back, buf, n), "synth round trip case %d", c);
            free(back);
            back = stream_checked(t, ids + 1, (size_t)m - 1, special ? MU_DETOK_SPECIAL : 0, &len);
            if (valid_utf8(buf, n)) CHECK(len == n && !memcmp(back, buf, n));
            free(back);
            free(ids);
        }
    }
    char *bad = mu_detokenize(t, (const int32_t[]){1, 100000}, 2, false, false, NULL, &err);
    CHECK(bad == NULL && strstr(err.msg, "100000"));
    mu_tokenizer_free(t);
    gguf_close(f);
    unlink(o.out_path);
}

/* ---------------- detokenization rules ---------------- */

static void test_detokenize_rules(void) {
    vocab v;
    mu_error err;
    size_t n;
    if (open_vocab("ggml-vocab-gpt-2", &v)) {
        /* gpt-2 cleans " ," / " '" / " 's" like llama.cpp */
        const char *s = "a , b ' c 's";
        int32_t *ids = NULL;
        int64_t k = tokenize(v.t, s, strlen(s), false, false, &ids);
        char *out = mu_detokenize(v.t, ids, (size_t)k, false, false, &n, &err);
        CHECK(out && !strcmp(out, "a, b'c's"));
        free(out);
        free(ids);
        close_vocab(&v);
    }
    if (open_vocab("ggml-vocab-llama-spm", &v)) {
        int32_t *ids = NULL;
        int64_t k = tokenize(v.t, "Hello world", 11, false, false, &ids);
        char *out = mu_detokenize(v.t, ids, (size_t)k, false, false, &n, &err);
        CHECK(out && !strcmp(out, "Hello world")); /* leading space of ▁Hello dropped */
        free(out);
        free(ids);
        close_vocab(&v);
    }
}

/* ---------------- threads ---------------- */

typedef struct thread_job {
    const mu_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    int64_t n;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    for (int rep = 0; rep < 5; rep++) {
        free(j->ids);
        j->n = mu_tokenize(j->t, j->text, j->len, false, false, &j->ids, NULL);
    }
    return NULL;
}

static void test_threads(void) {
    vocab v;
    if (!open_vocab("ggml-vocab-deepseek-coder", &v)) return;
    char path[1200];
    size_t len;
    snprintf(path, sizeof path, "%s/ggml-vocab-deepseek-coder.gguf.inp", g_data_dir);
    char *text = tu_read_file(path, &len);
    if (text) {
        int32_t *ref = NULL;
        int64_t nref = tokenize(v.t, text, len, false, false, &ref);
        thread_job jobs[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            jobs[i] = (thread_job){v.t, text, len, NULL, -1};
            pthread_create(&th[i], NULL, thread_main, &jobs[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK(jobs[i].n == nref && !memcmp(jobs[i].ids, ref, (size_t)nref * sizeof *ref));
            free(jobs[i].ids);
        }
        free(ref);
    }
    free(text);
    close_vocab(&v);
}

/* ---------------- llama.cpp regression cases ---------------- */

/* A copy of a test vocabulary with another tokenizer.ggml.pre. */
static mu_tokenizer *load_variant(const char *name, const char *pre, gguf_file **f) {
    vocab v;
    *f = NULL;
    if (!open_vocab(name, &v)) return NULL;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < v.f->n_kv; i++) gguf_writer_copy_kv(w, &v.f->kv[i]);
    gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    mu_error err;
    char *path = tmp_path("variant.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    close_vocab(&v);
    mu_tokenizer *t = try_load(path, NULL, f);
    unlink(path);
    return t;
}

typedef struct expect_case {
    const char *text;
    int32_t ids[40];
    int n;
} expect_case;

static void check_cases(const char *label, const mu_tokenizer *t, const expect_case *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = NULL;
        int64_t k = tokenize(t, c[i].text, strlen(c[i].text), false, false, &ids);
        bool same = k == c[i].n && !memcmp(ids, c[i].ids, (size_t)k * sizeof *ids);
        CHECK_MSG(same, "%s: '%s' tokenizes differently from llama.cpp", label, c[i].text);
        free(ids);
    }
}

/* Outputs of llama.cpp's llama_tokenize (add_special and parse_special
 * off) for cases the test files do not cover: the llama4 / GPT-4o regex
 * (Muse Glimmer), and non-ASCII whitespace (U+0085, U+00A0, U+2003, U+2028,
 * U+3000) next to letters and inside deepseek-coder's CJK ranges. */
static void test_regressions(void) {
    static const expect_case llama4[] = {
        {"HELLOworld camelCaseWORDs", {13909, 3069, 46, 6894, 41021, 20448, 54, 12532, 82}, 9},
        {"don'T we'RE I'LL", {9099, 6, 51, 356, 6, 2200, 314, 6, 3069}, 9},
        {"123456789 3.14", {10163, 29228, 40401, 220, 18, 13, 1415}, 7},
        {"a\n\n  b\r\n\tc", {64, 628, 220, 275, 201, 198, 197, 66}, 8},
        {" ?!\n/x //\n", {5633, 0, 198, 14, 87, 3373, 198}, 7},
        {"\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac \xce\x9a\xce\x95\xce\xa6"
         "\xce\x91\xce\x9b\xce\x91\xce\x99\xce\x91 \xc7\x85" "emal",
         {138, 243, 39377, 39377, 138, 115, 26180, 29945, 43000, 138, 105, 7377, 248, 138, 243, 138,
          99, 138, 239, 138, 249, 138, 239, 138, 247, 138, 239, 220, 131, 227, 368, 282}, 32},
        {"x\xc2\x85y\xc2\xa0 z\xe3\x80\x80w", {87, 126, 227, 88, 1849, 1976, 5099, 222, 86}, 9},
        {"\xe2\x80\x83\xe2\x80\x83word  ", {447, 225, 447, 225, 4775, 220, 220}, 7},
    };
    static const expect_case deepseek[] = {
        {"  \xe2\x80\x83\xe2\x80\x83\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x80x",
         {243, 350, 212, 350, 212, 759, 1919, 343, 209, 87}, 10},
        {"a\xc2\x85" "b\xc2\xa0\xe2\x80\xa8" "c", {64, 124, 214, 65, 1200, 350, 101, 66}, 8},
    };
    static const expect_case gpt2[] = {
        {"a\xc2\x85" "b\xc2\xa0 c\xe2\x80\xa8\xe2\x80\xa8" "d",
         {64, 126, 227, 65, 1849, 269, 447, 101, 447, 101, 67}, 11},
    };
    gguf_file *f;
    mu_tokenizer *t = load_variant("ggml-vocab-gpt-2", "llama4", &f);
    if (t) {
        check_cases("gpt-2 vocab, llama4", t, llama4, sizeof llama4 / sizeof llama4[0]);
        mu_tokenizer_free(t);
        gguf_close(f);
    }
    /* deepseek-coder's CJK ranges include U+2003, which llama.cpp never
     * matches there; on the gpt-2 vocabulary " \u2003" becomes one token */
    static const expect_case deepseek_on_gpt2[] = {
        {"  \xe2\x80\x83\xe2\x80\x83", {220, 564, 225, 447, 225}, 5},
        {" \xe2\x80\x83/", {220, 447, 225, 14}, 4},
    };
    t = load_variant("ggml-vocab-gpt-2", "deepseek-coder", &f);
    if (t) {
        check_cases("gpt-2 vocab, deepseek-coder", t, deepseek_on_gpt2,
                    sizeof deepseek_on_gpt2 / sizeof deepseek_on_gpt2[0]);
        mu_tokenizer_free(t);
        gguf_close(f);
    }
    vocab v;
    if (open_vocab("ggml-vocab-deepseek-coder", &v)) {
        check_cases("deepseek-coder", v.t, deepseek, sizeof deepseek / sizeof deepseek[0]);
        close_vocab(&v);
    }
    if (open_vocab("ggml-vocab-gpt-2", &v)) {
        check_cases("gpt-2", v.t, gpt2, sizeof gpt2 / sizeof gpt2[0]);
        close_vocab(&v);
    }
}

/* ---------------- throughput (printed, not asserted) ---------------- */

static void bench(const char *label, const mu_tokenizer *t) {
    mu_error err = {{0}};
    double mbs = mu_tokenizer_bench(t, 4u << 20, &err);
    CHECK_MSG(mbs > 0, "%s", err.msg);
    printf("throughput %-34s %7.1f MB/s\n", label, mbs);
}

static void test_bench(void) {
    vocab v;
    if (open_vocab("ggml-vocab-gpt-2", &v)) {
        bench("gpt-2 (gpt2/gpt-2)", v.t);
        close_vocab(&v);
    }
    gguf_file *f;
    mu_tokenizer *t = load_variant("ggml-vocab-gpt-2", "llama4", &f);
    if (t) { /* the Muse Glimmer pre-tokenizer on a real 50k vocabulary */
        bench("gpt-2 vocab, llama4 pre-tokenizer", t);
        mu_tokenizer_free(t);
        gguf_close(f);
    }
    if (open_vocab("ggml-vocab-llama-spm", &v)) {
        bench("llama-spm (llama)", v.t);
        close_vocab(&v);
    }
}

static void cleanup_tmp(void) {
    static const char *const names[] = {"ok.gguf", "pre.gguf", "model.gguf", "nomodel.gguf",
                                        "eos.gguf", "dup.gguf", "ints.gguf", "types.gguf",
                                        "nopre.gguf", "synth.gguf", "variant.gguf", "noeos.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp_path(names[i]));
    rmdir(g_tmp);
}

int main(void) {
    find_data_dir();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/mu_tok_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_byte_table();
    test_utf8_rules();
    test_vocab_files();
    test_stream_spm_bytes();
    test_stream_bytelevel();
    test_parse_special();
    test_refusals();
    test_eog();
    test_synth();
    test_detokenize_rules();
    test_threads();
    test_regressions();
    test_bench();
    cleanup_tmp();
    TEST_MAIN_END();
}

/* Regex pre-tokenizers of the byte-level BPE vocabularies, with PCRE2.
 *
 * The regex strings are llama.cpp's (the adapted forms it actually runs,
 * e.g. (?:'[sS]|...) instead of (?i:'s|...)). Several regexes may apply in
 * sequence: each one splits every piece left by the previous one into its
 * matches and the unmatched text between them, which stay pieces too.
 *
 * Rewrites that keep PCRE2 faithful to llama.cpp's engine:
 *   - \s / \S become an explicit class of the Unicode White_Space characters
 *     (llama.cpp's whitespace table; PCRE2's own \s misses U+0085);
 *   - in regexes without \p{..}, classes with non-ASCII members do not match
 *     non-ASCII whitespace (llama.cpp turns it into U+000B for those);
 *   - capturing groups become non-capturing (no captures are used; this
 *     keeps the JIT's backtracking memory flat).
 * Patterns compile with PCRE2_DOLLAR_ENDONLY ($ = end of piece, as in
 * ECMAScript), and matches never start before or look beyond the piece. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

static const char *const RE_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" CONTRACTIONS "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const RE_LLAMA3[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const RE_QWEN2[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
#define GPT2_WORDS "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
static const char *const RE_GPT2[] = {GPT2_WORDS, NULL};
static const char *const RE_STARCODER[] = {"\\p{N}", GPT2_WORDS, NULL};
static const char *const RE_FALCON[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_WORDS, "[0-9][0-9][0-9]", NULL};
static const char *const RE_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_WORDS, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
/* Literal non-ASCII characters are written as \\x{...} escapes. */
#define CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
static const char *const RE_DEEPSEEK_CODER[] = {
    "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK, "\\p{N}", NULL};
static const char *const RE_DEEPSEEK_LLM[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-"
    "\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-"
    "\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-"
    "\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}"
    "\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-"
    "\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    CJK,
    "\\p{N}+",
    NULL};

/* tokenizer.ggml.pre values and what llama.cpp does with each. */
typedef struct pre_entry {
    const char *name;
    const char *const *re;
    bool clean_spaces, ignore_merges, add_bos, no_bos;
} pre_entry;

static const pre_entry PRE_TABLE[] = {
    {"default", RE_DEFAULT, true, false, false, false},
    /* Llama-4 / GPT-4o family: Muse Glimmer */
    {"llama4", RE_GPT4O, false, false, false, false},
    {"gpt-4o", RE_GPT4O, false, false, false, false},
    {"kanana2", RE_GPT4O, false, false, false, false},
    {"talkie", RE_GPT4O, false, false, false, false},
    {"minimax-m2", RE_GPT4O, false, false, false, false},
    /* Llama-3 family: whole-word vocabulary hits skip the merges */
    {"llama3", RE_LLAMA3, true, true, true, false},
    {"llama-v3", RE_LLAMA3, true, true, true, false},
    {"llama-bpe", RE_LLAMA3, true, true, true, false},
    {"falcon3", RE_LLAMA3, true, true, true, false},
    {"falcon-h1", RE_LLAMA3, true, true, true, false},
    {"pixtral", RE_LLAMA3, true, true, true, false},
    {"midm-2.0", RE_LLAMA3, true, true, true, false},
    {"lfm2", RE_LLAMA3, true, true, true, false},
    {"jina-v5-nano", RE_LLAMA3, true, true, true, false},
    {"dbrx", RE_LLAMA3, true, false, false, false},
    {"smaug-bpe", RE_LLAMA3, true, false, false, false},
    {"glm4", RE_LLAMA3, true, false, false, true},
    {"chatglm-bpe", RE_LLAMA3, true, false, false, true},
    /* Qwen-2 */
    {"qwen2", RE_QWEN2, false, false, false, false},
    {"deepseek-r1-qwen", RE_QWEN2, false, false, false, false},
    {"kormo", RE_QWEN2, false, false, false, false},
    {"f2llmv2", RE_QWEN2, false, false, false, false},
    {"hunyuan", RE_QWEN2, false, false, false, false},
    {"solar-open", RE_QWEN2, false, false, false, false},
    {"megrez", RE_QWEN2, true, false, false, false},
    {"stablelm2", RE_QWEN2, true, false, false, false},
    /* GPT-2 */
    {"gpt-2", RE_GPT2, true, false, false, false},
    {"phi-2", RE_GPT2, true, false, false, false},
    {"mpt", RE_GPT2, true, false, false, false},
    {"olmo", RE_GPT2, true, false, false, false},
    {"jais", RE_GPT2, true, false, false, false},
    {"gigachat", RE_GPT2, true, false, false, false},
    {"a.x-4.0", RE_GPT2, true, false, false, false},
    {"mellum", RE_GPT2, true, false, false, false},
    {"modern-bert", RE_GPT2, true, false, false, false},
    {"exaone4", RE_GPT2, true, false, false, false},
    {"jina-es", RE_GPT2, true, false, false, false},
    {"jina-de", RE_GPT2, true, false, false, false},
    {"jina-v2-es", RE_GPT2, true, false, false, false},
    {"jina-v2-de", RE_GPT2, true, false, false, false},
    {"jina-v1-en", RE_GPT2, true, false, false, false},
    {"jina-v2-code", RE_GPT2, true, false, false, false},
    {"roberta-bpe", RE_GPT2, true, false, false, false},
    {"trillion", RE_GPT2, false, false, false, false},
    {"granite-docling", RE_GPT2, false, false, false, false},
    /* StarCoder (digits split first) */
    {"starcoder", RE_STARCODER, true, false, false, false},
    {"refact", RE_STARCODER, true, false, false, false},
    {"codeshell", RE_STARCODER, true, false, false, false},
    {"exaone", RE_STARCODER, true, false, false, false},
    {"minerva-7b", RE_STARCODER, true, false, false, false},
    {"mellum2", RE_STARCODER, true, false, false, false},
    {"command-r", RE_STARCODER, false, false, false, false},
    {"smollm", RE_STARCODER, false, false, false, false},
    /* others */
    {"falcon", RE_FALCON, true, false, false, false},
    {"deepseek-coder", RE_DEEPSEEK_CODER, false, false, false, false},
    {"deepseek-llm", RE_DEEPSEEK_LLM, false, false, false, false},
};

enum { MAX_RE = 8 };

struct tok_pre {
    char *name;
    int n_re;
    const char *src[MAX_RE];
    pcre2_code *re[MAX_RE];
};

struct tok_pre_state {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
};

/* White_Space, as llama.cpp's unicode_set_whitespace. */
#define WS_NON_ASCII "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
                     "\\x{205F}\\x{3000}"
#define WS_CHARS "\\t\\n\\x0B\\f\\r " WS_NON_ASCII

static void put(char **o, const char *s) {
    size_t n = strlen(s);
    memcpy(*o, s, n);
    *o += n;
}

/* Index of the ']' closing the class that opens at re[i]. */
static size_t class_end(const char *re, size_t i) {
    size_t j = i + 1;
    if (re[j] == '^') j++;
    for (; re[j] && re[j] != ']'; j++)
        if (re[j] == '\\' && re[j + 1]) j++;
    return j;
}

/* Apply the rewrites described at the top. NULL if the pattern uses \S
 * inside a class (not needed by any table entry). */
static char *rewrite_regex(const char *re) {
    size_t n = strlen(re);
    char *out = mu_xmalloc(n * (sizeof WS_CHARS + 4) + 64 * n + 1), *o = out;
    bool in_class = false, wide = !strstr(re, "\\p{");
    size_t wrap_end = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char e = re[++i];
            if (e == 's') {
                put(&o, in_class ? WS_CHARS : "[" WS_CHARS "]");
            } else if (e == 'S') {
                if (in_class) {
                    free(out);
                    return NULL;
                }
                put(&o, "[^" WS_CHARS "]");
            } else {
                *o++ = '\\';
                *o++ = e;
            }
            continue;
        }
        if (in_class) {
            *o++ = c;
            if (c == ']') {
                in_class = false;
                if (i == wrap_end) *o++ = ')';
            }
        } else if (c == '[') {
            size_t end = class_end(re, i);
            bool negated = re[i + 1] == '^';
            /* llama.cpp matches regexes without \p{..} on code points with
             * non-ASCII whitespace replaced by U+000B, so its literal ranges
             * never match such whitespace: exclude it explicitly */
            if (wide && !negated && memmem(re + i, end - i, "\\x{", 3)) {
                put(&o, "(?:(?![" WS_NON_ASCII "])");
                wrap_end = end;
            }
            in_class = true;
            *o++ = c;
            if (negated) *o++ = re[++i];
        } else if (c == '(' && (i + 1 >= n || re[i + 1] != '?')) {
            put(&o, "(?:");
        } else {
            *o++ = c;
        }
    }
    *o = '\0';
    return out;
}

static const pre_entry *find_entry(const char *name) {
    for (size_t i = 0; i < sizeof PRE_TABLE / sizeof PRE_TABLE[0]; i++)
        if (!strcmp(PRE_TABLE[i].name, name)) return &PRE_TABLE[i];
    return NULL;
}

tok_pre *tok_pre_new(const char *name, tok_pre_flags *flags, mu_error *err) {
    const pre_entry *e = find_entry(name ? name : "default");
    if (!e) {
        mu_err_set(err, "unknown pre-tokenizer type: tokenizer.ggml.pre = '%s'", name);
        return NULL;
    }
    tok_pre *p = mu_xcalloc(1, sizeof *p);
    p->name = mu_xstrdup(e->name);
    flags->clean_spaces = e->clean_spaces;
    flags->ignore_merges = e->ignore_merges;
    flags->add_bos_default = e->add_bos;
    flags->no_bos = e->no_bos;
    for (int i = 0; e->re[i]; i++) {
        char *src = rewrite_regex(e->re[i]);
        int code = 0;
        PCRE2_SIZE off = 0;
        pcre2_code *re = NULL;
        if (src)
            re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &code, &off, NULL);
        free(src);
        if (!re) {
            PCRE2_UCHAR msg[256] = "unsupported \\S inside a class";
            if (code) pcre2_get_error_message(code, msg, sizeof msg);
            mu_err_set(err, "internal: pre-tokenizer '%s' regex %d does not compile: %s", e->name,
                       i, (const char *)msg);
            tok_pre_free(p);
            return NULL;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter remains if JIT is absent */
        p->src[i] = e->re[i];
        p->re[p->n_re++] = re;
    }
    return p;
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p->name);
    free(p);
}

const char *tok_pre_name(const tok_pre *p) {
    return p->name;
}

tok_pre_state *tok_pre_state_new(const tok_pre *p) {
    (void)p;
    tok_pre_state *s = mu_xcalloc(1, sizeof *s);
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    if (!s->md || !s->mctx) {
        fprintf(stderr, "muser: out of memory creating PCRE2 match data\n");
        abort();
    }
    return s;
}

void tok_pre_state_free(tok_pre_state *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    if (s->jit_stack) pcre2_jit_stack_free(s->jit_stack);
    free(s);
}

/* One search from pos; 1 = match in [*ms, *me), 0 = none, -1 = error. */
static int search(const tok_pre *p, int level, tok_pre_state *s, const char *subj, size_t len,
                  size_t pos, size_t *ms, size_t *me, mu_error *err) {
    int rc = pcre2_match(p->re[level], (PCRE2_SPTR)subj, len, pos,
                         PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY, s->md, s->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !s->jit_stack) {
        /* very long pieces: give the JIT a heap stack and retry once */
        s->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (s->jit_stack) {
            pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
            rc = pcre2_match(p->re[level], (PCRE2_SPTR)subj, len, pos,
                             PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY, s->md, s->mctx);
        }
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        mu_err_set(err, "pre-tokenizer '%s' regex %d failed on a %zu-byte piece: %s", p->name,
                   level, len, (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

typedef struct split_ctx {
    const tok_pre *p;
    tok_pre_state *s;
    const char *text;
    tok_piece_fn emit;
    void *ctx;
    mu_error *err;
} split_ctx;

static bool split_level(split_ctx *c, int level, size_t start, size_t len) {
    if (level == c->p->n_re) return c->emit(c->ctx, start, len);
    const char *subj = c->text + start;
    size_t last = 0;
    while (last < len) {
        size_t ms, me;
        int rc = search(c->p, level, c->s, subj, len, last, &ms, &me, c->err);
        if (rc < 0) return false;
        if (rc == 0) break;
        if (ms > last && !split_level(c, level + 1, start + last, ms - last)) return false;
        if (!split_level(c, level + 1, start + ms, me - ms)) return false;
        last = me;
    }
    if (last < len && !split_level(c, level + 1, start + last, len - last)) return false;
    return true;
}

bool tok_pre_split(const tok_pre *p, tok_pre_state *s, const char *text, size_t n,
                   tok_piece_fn emit, void *ctx, mu_error *err) {
    split_ctx c = {p, s, text, emit, ctx, err};
    return n == 0 || split_level(&c, 0, 0, n);
}

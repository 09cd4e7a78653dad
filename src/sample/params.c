/* Sampler parameters: llama.cpp defaults, chain-order parsing (--samplers
 * names and --sampling-seq letters, with llama's aliases) and the llama-style
 * printouts for --help and logs. */
#include "sample/sample.h"
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>

typedef struct kind_info {
    const char *name;  /* canonical --samplers name */
    char letter;       /* --sampling-seq letter */
    const char *stage; /* llama sampler name in the printed chain */
} kind_info;

static const kind_info KINDS[MU_SAMPLER_KIND_COUNT] = {
    [MU_SAMPLER_PENALTIES] = {"penalties", 'e', "penalties"},
    [MU_SAMPLER_DRY] = {"dry", 'd', "dry"},
    [MU_SAMPLER_TOP_N_SIGMA] = {"top_n_sigma", 's', "top-n-sigma"},
    [MU_SAMPLER_TOP_K] = {"top_k", 'k', "top-k"},
    [MU_SAMPLER_TYPICAL_P] = {"typ_p", 'y', "typical"},
    [MU_SAMPLER_TOP_P] = {"top_p", 'p', "top-p"},
    [MU_SAMPLER_MIN_P] = {"min_p", 'm', "min-p"},
    [MU_SAMPLER_XTC] = {"xtc", 'x', "xtc"},
    [MU_SAMPLER_TEMPERATURE] = {"temperature", 't', "temp-ext"},
};

static const char *const DEFAULT_BREAKERS[] = {"\n", ":", "\"", "*"};

static const mu_sampler_kind DEFAULT_ORDER[] = {
    MU_SAMPLER_PENALTIES, MU_SAMPLER_DRY,   MU_SAMPLER_TOP_N_SIGMA,
    MU_SAMPLER_TOP_K,     MU_SAMPLER_TYPICAL_P, MU_SAMPLER_TOP_P,
    MU_SAMPLER_MIN_P,     MU_SAMPLER_XTC,   MU_SAMPLER_TEMPERATURE,
};

void mu_sampler_params_default(mu_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->seed = MU_SEED_RANDOM;
    p->temp = 0.80f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->typ_p = 1.00f;
    p->top_n_sigma = -1.00f;
    p->xtc_probability = 0.00f;
    p->xtc_threshold = 0.10f;
    p->penalty_last_n = 64;
    p->penalty_repeat = 1.00f;
    p->penalty_freq = 0.00f;
    p->penalty_present = 0.00f;
    p->dry_multiplier = 0.0f;
    p->dry_base = 1.75f;
    p->dry_allowed_length = 2;
    p->dry_penalty_last_n = -1;
    p->dry_breakers = DEFAULT_BREAKERS;
    p->n_dry_breakers = sizeof DEFAULT_BREAKERS / sizeof *DEFAULT_BREAKERS;
    p->dynatemp_range = 0.00f;
    p->dynatemp_exponent = 1.00f;
    p->mirostat = 0;
    p->mirostat_tau = 5.00f;
    p->mirostat_eta = 0.10f;
    p->min_keep = 0;
    memcpy(p->order, DEFAULT_ORDER, sizeof DEFAULT_ORDER);
    p->n_order = sizeof DEFAULT_ORDER / sizeof *DEFAULT_ORDER;
}

const char *mu_sampler_kind_name(mu_sampler_kind k) {
    return (unsigned)k < MU_SAMPLER_KIND_COUNT ? KINDS[k].name : "?";
}

char mu_sampler_kind_char(mu_sampler_kind k) {
    return (unsigned)k < MU_SAMPLER_KIND_COUNT ? KINDS[k].letter : '?';
}

/* llama derives two aliases from every canonical name with '_' ("top-k",
 * "topk") and adds nucleus, temp and typ. Names arrive lower-cased. */
static bool kind_from_name(const char *name, mu_sampler_kind *out) {
    static const struct { const char *alias; mu_sampler_kind kind; } extra[] = {
        {"nucleus", MU_SAMPLER_TOP_P}, {"temp", MU_SAMPLER_TEMPERATURE}, {"typ", MU_SAMPLER_TYPICAL_P}};
    for (int k = 0; k < MU_SAMPLER_KIND_COUNT; k++) {
        const char *canon = KINDS[k].name;
        char kebab[32], joined[32];
        size_t j = 0;
        for (size_t i = 0; canon[i]; i++) {
            kebab[i] = canon[i] == '_' ? '-' : canon[i];
            kebab[i + 1] = '\0';
            if (canon[i] != '_') joined[j++] = canon[i];
        }
        joined[j] = '\0';
        if (!strcmp(name, canon) || !strcmp(name, kebab) || !strcmp(name, joined)) {
            *out = (mu_sampler_kind)k;
            return true;
        }
    }
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
        if (!strcmp(name, extra[i].alias)) {
            *out = extra[i].kind;
            return true;
        }
    }
    return false;
}

static bool llama_only_name(const char *name) {
    return !strcmp(name, "infill") || !strcmp(name, "adaptive_p") || !strcmp(name, "adaptive-p") ||
           !strcmp(name, "adaptivep");
}

/* Appends to a bounded message buffer. */
static void msg_add(char *msg, size_t cap, const char *fmt, ...) {
    size_t len = strlen(msg);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + len, cap - len, fmt, ap);
    va_end(ap);
}

bool mu_sampler_parse_names(const char *text, mu_sampler_kind *order, size_t *n_order,
                            mu_error *err) {
    char bad[768] = "";
    size_t n = 0, n_bad = 0;
    bool too_many = false;
    *n_order = 0;
    if (!text[0]) return true; /* an empty list: only the final draw */
    for (const char *s = text;;) {
        const char *e = strchr(s, ';');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char name[64];
        size_t keep = len < sizeof name - 1 ? len : sizeof name - 1;
        for (size_t i = 0; i < keep; i++) name[i] = (char)tolower((unsigned char)s[i]);
        name[keep] = '\0';
        mu_sampler_kind k;
        if (len < sizeof name && kind_from_name(name, &k)) {
            if (n < MU_SAMPLER_MAX_ORDER) order[n++] = k;
            else too_many = true;
        } else {
            msg_add(bad, sizeof bad, "%s'%.*s'%s", n_bad ? ", " : "", (int)(len > 40 ? 40 : len), s,
                    llama_only_name(name) ? " (llama.cpp sampler not implemented in muser)" : "");
            n_bad++;
        }
        if (!e) break;
        s = e + 1;
    }
    if (n_bad) {
        mu_err_set(err, "unknown sampler name%s %s; known: penalties, dry, top_n_sigma, top_k, "
                   "typ_p, top_p, min_p, xtc, temperature (also top-k/topk style, nucleus, temp, typ)",
                   n_bad > 1 ? "s" : "", bad);
        return false;
    }
    if (too_many) {
        mu_err_set(err, "sampler list has more than %d entries", MU_SAMPLER_MAX_ORDER);
        return false;
    }
    *n_order = n;
    return true;
}

bool mu_sampler_parse_chars(const char *text, mu_sampler_kind *order, size_t *n_order,
                            mu_error *err) {
    char bad[256] = "";
    size_t n = 0, n_bad = 0, len = strlen(text);
    *n_order = 0;
    if (len > MU_SAMPLER_MAX_ORDER) {
        mu_err_set(err, "sampler sequence \"%.40s\" has more than %d letters", text,
                   MU_SAMPLER_MAX_ORDER);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        int k = 0;
        while (k < MU_SAMPLER_KIND_COUNT && KINDS[k].letter != text[i]) k++;
        if (k < MU_SAMPLER_KIND_COUNT) {
            order[n++] = (mu_sampler_kind)k;
        } else {
            bool printable = isprint((unsigned char)text[i]);
            msg_add(bad, sizeof bad, printable ? "%s'%c' at %zu" : "%s'\\x%02x' at %zu",
                    n_bad ? ", " : "", printable ? text[i] : (unsigned char)text[i], i);
            n_bad++;
        }
    }
    if (n_bad) {
        mu_err_set(err, "unknown sampler letter%s %s in \"%.40s\"; known: e=penalties d=dry "
                   "s=top_n_sigma k=top_k y=typ_p p=top_p m=min_p x=xtc t=temperature",
                   n_bad > 1 ? "s" : "", bad, text);
        return false;
    }
    *n_order = n;
    return true;
}

/* snprintf-style append: always counts, writes what fits. */
typedef struct out_buf {
    char *buf;
    size_t cap, len;
} out_buf;

static void out_add(out_buf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *dst = o->len < o->cap ? o->buf + o->len : NULL;
    int n = vsnprintf(dst, dst ? o->cap - o->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static out_buf out_start(char *buf, size_t cap) {
    if (buf && cap) buf[0] = '\0';
    return (out_buf){buf, buf ? cap : 0, 0};
}

size_t mu_sampler_order_names(const mu_sampler_kind *order, size_t n, char *buf, size_t cap) {
    out_buf o = out_start(buf, cap);
    for (size_t i = 0; i < n; i++) out_add(&o, "%s%s", i ? ";" : "", mu_sampler_kind_name(order[i]));
    return o.len;
}

size_t mu_sampler_order_chars(const mu_sampler_kind *order, size_t n, char *buf, size_t cap) {
    out_buf o = out_start(buf, cap);
    for (size_t i = 0; i < n; i++) out_add(&o, "%c", mu_sampler_kind_char(order[i]));
    return o.len;
}

size_t mu_sampler_params_print(const mu_sampler_params *p, char *buf, size_t cap) {
    out_buf o = out_start(buf, cap);
    out_add(&o,
            "\trepeat_last_n = %d, repeat_penalty = %.3f, frequency_penalty = %.3f, presence_penalty = %.3f\n"
            "\tdry_multiplier = %.3f, dry_base = %.3f, dry_allowed_length = %d, dry_penalty_last_n = %d\n"
            "\ttop_k = %d, top_p = %.3f, min_p = %.3f, xtc_probability = %.3f, xtc_threshold = %.3f, "
            "typical_p = %.3f, top_n_sigma = %.3f, temp = %.3f\n"
            "\tmirostat = %d, mirostat_lr = %.3f, mirostat_ent = %.3f",
            p->penalty_last_n, (double)p->penalty_repeat, (double)p->penalty_freq,
            (double)p->penalty_present, (double)p->dry_multiplier, (double)p->dry_base,
            p->dry_allowed_length, p->dry_penalty_last_n, p->top_k, (double)p->top_p,
            (double)p->min_p, (double)p->xtc_probability, (double)p->xtc_threshold,
            (double)p->typ_p, (double)p->top_n_sigma, (double)p->temp, p->mirostat,
            (double)p->mirostat_eta, (double)p->mirostat_tau);
    return o.len;
}

bool mu_sampler_stage_active(const mu_sampler_params *p, mu_sampler_kind k) {
    switch (k) {
    case MU_SAMPLER_PENALTIES:
        return p->penalty_last_n != 0 &&
               !(p->penalty_repeat == 1.0f && p->penalty_freq == 0.0f && p->penalty_present == 0.0f);
    case MU_SAMPLER_DRY:
        return p->dry_multiplier != 0.0f && p->dry_base >= 1.0f && p->dry_penalty_last_n != 0;
    case MU_SAMPLER_TOP_N_SIGMA: return p->top_n_sigma > 0.0f;
    case MU_SAMPLER_TOP_K: return p->top_k > 0;
    case MU_SAMPLER_TYPICAL_P: return !(p->typ_p >= 1.0f);
    case MU_SAMPLER_TOP_P: return !(p->top_p >= 1.0f);
    case MU_SAMPLER_MIN_P: return !(p->min_p <= 0.0f);
    case MU_SAMPLER_XTC: return !(p->xtc_probability <= 0.0f || p->xtc_threshold > 0.5f);
    case MU_SAMPLER_TEMPERATURE: return !(p->temp == 1.0f && p->dynatemp_range <= 0.0f);
    default: return false;
    }
}

size_t mu_sampler_chain_print(const mu_sampler_params *p, char *buf, size_t cap) {
    out_buf o = out_start(buf, cap);
    out_add(&o, "logits ");
    if (p->n_logit_bias > 0) out_add(&o, "-> logit-bias ");
    if (p->mirostat == 1 || p->mirostat == 2) {
        out_add(&o, "-> %stemp ", p->temp == 1.0f ? "?" : "");
        out_add(&o, "-> %s ", p->mirostat == 1 ? "mirostat" : "mirostat-v2");
        return o.len;
    }
    for (size_t i = 0; i < p->n_order; i++) {
        mu_sampler_kind k = p->order[i];
        const char *name = (unsigned)k < MU_SAMPLER_KIND_COUNT ? KINDS[k].stage : "unknown";
        out_add(&o, "-> %s%s ", mu_sampler_stage_active(p, k) ? "" : "?", name);
    }
    out_add(&o, "-> dist ");
    return o.len;
}

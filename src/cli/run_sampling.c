/* `muser run` sampling options. Numeric flags are one table (name, field,
 * range, help), so parsing and the --help defaults come from the same place
 * and cannot drift apart. */
#include "run_sampling.h"
#include "cli.h"
#include "sample/sample.h"
#include "util/common.h"
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The values a float option accepts. llama.cpp checks almost none of these
 * (a --top-p of 2 silently means "off"); here a value outside the range
 * every sampler documents is refused by name, while the values llama.cpp
 * gives a meaning to (top-k <= 0 = off, last-n -1 = context, top-n-sigma
 * <= 0 = off, xtc-threshold above 0.5 = off) stay accepted. */
typedef enum frange {
    FR_ANY,   /* any finite number (presence/frequency penalties: negative rewards) */
    FR_GE0,   /* >= 0 */
    FR_GT0,   /* > 0: the repeat penalty divides positive logits by it */
    FR_GE1,   /* >= 1: DRY's base is raised to the repeat length */
    FR_UNIT,  /* a probability, in [0, 1] */
} frange;

static const char *const FRANGE_TEXT[] = {"finite", ">= 0", "> 0", ">= 1", "in [0, 1]"};

typedef struct num_opt {
    const char *name, *alias;
    bool is_float;
    size_t offset;          /* into muser_sampling_params */
    int64_t lo, hi;         /* integer range */
    frange fr;              /* float range */
    const char *help;
} num_opt;

#define F(field, fr) true, offsetof(muser_sampling_params, field), 0, 0, fr
#define I(field, lo, hi) false, offsetof(muser_sampling_params, field), lo, hi, FR_ANY

static const num_opt NUM_OPTS[] = {
    {"--temp", "--temperature", F(temp, FR_GE0), "temperature; 0 = greedy (lowest id wins ties)"},
    {"--top-k", NULL, I(top_k, INT32_MIN, INT32_MAX), "top-k; <= 0 = off"},
    {"--top-p", NULL, F(top_p, FR_UNIT), "top-p (nucleus), in [0, 1]; 1.0 = off"},
    {"--min-p", NULL, F(min_p, FR_UNIT), "min-p, in [0, 1]; 0.0 = off"},
    {"--typical", "--typical-p", F(typ_p, FR_UNIT), "locally typical p, in [0, 1]; 1.0 = off"},
    {"--top-nsigma", "--top-n-sigma", F(top_n_sigma, FR_ANY), "top-n-sigma; <= 0 = off"},
    {"--xtc-probability", NULL, F(xtc_probability, FR_UNIT), "XTC probability, in [0, 1]; 0.0 = off"},
    {"--xtc-threshold", NULL, F(xtc_threshold, FR_UNIT), "XTC threshold, in [0, 1]; > 0.5 = off"},
    {"--repeat-last-n", NULL, I(penalty_last_n, -1, INT32_MAX), "tokens the penalties look back; 0 = off, -1 = context"},
    {"--repeat-penalty", NULL, F(penalty_repeat, FR_GT0), "repeat penalty, > 0; 1.0 = off"},
    {"--presence-penalty", NULL, F(penalty_present, FR_ANY), "presence penalty; 0.0 = off"},
    {"--frequency-penalty", NULL, F(penalty_freq, FR_ANY), "frequency penalty; 0.0 = off"},
    {"--dry-multiplier", NULL, F(dry_multiplier, FR_GE0), "DRY multiplier, >= 0; 0.0 = off"},
    {"--dry-base", NULL, F(dry_base, FR_GE1), "DRY base (>= 1)"},
    {"--dry-allowed-length", NULL, I(dry_allowed_length, 0, INT32_MAX), "DRY allowed repeat length"},
    {"--dry-penalty-last-n", NULL, I(dry_penalty_last_n, -1, INT32_MAX), "tokens DRY scans; 0 = off, -1 = context"},
    {"--dynatemp-range", NULL, F(dynatemp_range, FR_GE0), "dynamic temperature range, >= 0; 0.0 = off"},
    {"--dynatemp-exp", NULL, F(dynatemp_exponent, FR_GE0), "dynamic temperature exponent, >= 0"},
    {"--mirostat", NULL, I(mirostat, 0, 2), "0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replace the chain)"},
    {"--mirostat-lr", NULL, F(mirostat_eta, FR_GE0), "Mirostat learning rate (eta), >= 0"},
    {"--mirostat-ent", NULL, F(mirostat_tau, FR_GE0), "Mirostat target entropy (tau), >= 0"},
    {"--min-keep", NULL, I(min_keep, 0, INT32_MAX), "tokens every sampler keeps at least"},
    {"--n-probs", "--logprobs", I(n_probs, 0, 1 << 20), "with --json: each token's logprob and its N likeliest alternatives"},
};
#undef F
#undef I

void run_sampling_init(run_sampling *r) {
    memset(r, 0, sizeof *r);
    muser_sampling_params_default(&r->p);
}

void run_sampling_free(run_sampling *r) {
    free(r->bias);
    free(r->grammar_text);
    free(r->schema_text);
}

static bool in_range(frange fr, float f) {
    switch (fr) {
    case FR_GE0: return f >= 0.0f;
    case FR_GT0: return f > 0.0f;
    case FR_GE1: return f >= 1.0f;
    case FR_UNIT: return f >= 0.0f && f <= 1.0f;
    case FR_ANY: break;
    }
    return true;
}

static bool parse_num(const num_opt *o, const char *flag, const char *v, muser_sampling_params *p) {
    char *field = (char *)p + o->offset;
    if (o->is_float) {
        float f;
        if (!cli_parse_f32("run", flag, v, &f)) return false;
        if (!in_range(o->fr, f)) {
            fprintf(stderr, "muser run: %s must be %s, got '%s'\n", flag, FRANGE_TEXT[o->fr], v);
            return false;
        }
        memcpy(field, &f, sizeof f);
        return true;
    }
    int64_t x;
    if (!cli_parse_i64("run", flag, v, o->lo, o->hi, &x)) return false;
    int32_t i = (int32_t)x;
    memcpy(field, &i, sizeof i);
    return true;
}

/* llama's -s: an unsigned 32-bit seed; -1 (or 4294967295) = random. */
static bool parse_seed(const char *v, uint32_t *out) {
    if (!strcmp(v, "-1")) {
        *out = MUSER_SEED_RANDOM;
        return true;
    }
    int64_t x;
    if (!cli_parse_i64("run", "--seed", v, 0, UINT32_MAX, &x)) return false;
    *out = (uint32_t)x;
    return true;
}

/* llama's TOKEN_ID(+|-)BIAS, e.g. 15043+1, 15043-inf (bans the token). */
static bool parse_logit_bias(run_sampling *r, const char *v) {
    char *end;
    errno = 0;
    long id = strtol(v, &end, 10);
    bool ok = !errno && end != v && id >= 0 && id <= INT32_MAX && (*end == '+' || *end == '-');
    float bias = 0;
    if (ok) {
        char sign = *end++;
        char *stop;
        bias = strtof(end, &stop);
        ok = stop != end && !*stop && !isnan(bias) && (isfinite(bias) || sign == '-');
        if (sign == '-') bias = -bias;
    }
    if (!ok) {
        fprintf(stderr, "muser run: --logit-bias expects TOKEN_ID(+|-)BIAS (e.g. 15043+1, 15043-inf), got '%s'\n", v);
        return false;
    }
    r->bias = mu_xrealloc(r->bias, (r->p.n_logit_bias + 1) * sizeof *r->bias);
    r->bias[r->p.n_logit_bias++] = (muser_logit_bias){(int32_t)id, bias};
    r->p.logit_bias = r->bias;
    return true;
}

/* llama: the first breaker replaces the defaults; "none" clears them all. */
static bool add_breaker(run_sampling *r, const char *v) {
    if (!r->breakers_given) r->n_breakers = 0;
    r->breakers_given = true;
    if (!strcmp(v, "none")) {
        r->n_breakers = 0;
    } else if (r->n_breakers == RUN_MAX_BREAKERS) {
        fprintf(stderr, "muser run: at most %d --dry-sequence-breaker values\n", RUN_MAX_BREAKERS);
        return false;
    } else {
        r->breakers[r->n_breakers++] = v;
    }
    r->p.dry_sequence_breakers = r->breakers;
    r->p.n_dry_sequence_breakers = r->n_breakers;
    return true;
}

static bool check_order(const char *flag, const char *v, bool letters) {
    mu_sampler_kind order[MU_SAMPLER_MAX_ORDER];
    size_t n;
    mu_error err;
    bool ok = letters ? mu_sampler_parse_chars(v, order, &n, &err) : mu_sampler_parse_names(v, order, &n, &err);
    if (!ok) fprintf(stderr, "muser run: %s: %s\n", flag, err.msg);
    return ok;
}

int run_sampling_option(run_sampling *r, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = NULL;
    for (size_t k = 0; k < sizeof NUM_OPTS / sizeof NUM_OPTS[0]; k++) {
        const num_opt *o = &NUM_OPTS[k];
        if (strcmp(a, o->name) && (!o->alias || strcmp(a, o->alias))) continue;
        return cli_value("run", argc, argv, i, &v) && parse_num(o, a, v, &r->p) ? 1 : -1;
    }
    bool ok = true;
    if (!strcmp(a, "--ignore-eos")) r->p.ignore_eos = true;
    else if (!strcmp(a, "-s") || !strcmp(a, "--seed"))
        ok = cli_value("run", argc, argv, i, &v) && parse_seed(v, &r->p.seed);
    else if (!strcmp(a, "--samplers")) {
        ok = cli_value("run", argc, argv, i, &v) && check_order(a, v, false);
        r->p.samplers = v;
        r->p.sampling_seq = NULL; /* the last order flag wins, as in llama */
    } else if (!strcmp(a, "--sampling-seq") || !strcmp(a, "--sampler-seq")) {
        ok = cli_value("run", argc, argv, i, &v) && check_order(a, v, true);
        r->p.sampling_seq = v;
        r->p.samplers = NULL;
    } else if (!strcmp(a, "-l") || !strcmp(a, "--logit-bias"))
        ok = cli_value("run", argc, argv, i, &v) && parse_logit_bias(r, v);
    else if (!strcmp(a, "--dry-sequence-breaker"))
        ok = cli_value("run", argc, argv, i, &v) && add_breaker(r, v);
    else if (!strcmp(a, "--grammar")) ok = cli_value("run", argc, argv, i, &r->grammar_arg);
    else if (!strcmp(a, "--grammar-file")) ok = cli_value("run", argc, argv, i, &r->grammar_file);
    else if (!strcmp(a, "-j") || !strcmp(a, "--json-schema")) ok = cli_value("run", argc, argv, i, &r->schema_arg);
    else if (!strcmp(a, "-jf") || !strcmp(a, "--json-schema-file"))
        ok = cli_value("run", argc, argv, i, &r->schema_file);
    else return 0;
    return ok ? 1 : -1;
}

bool run_sampling_finish(run_sampling *r) {
    int given = (r->grammar_arg != NULL) + (r->grammar_file != NULL) + (r->schema_arg != NULL) +
                (r->schema_file != NULL);
    if (given > 1) {
        fprintf(stderr, "muser run: give one of --grammar, --grammar-file, --json-schema, --json-schema-file\n");
        return false;
    }
    size_t len;
    if (r->grammar_file && !(r->grammar_text = cli_read_file("run", r->grammar_file, &len))) return false;
    if (r->schema_file && !(r->schema_text = cli_read_file("run", r->schema_file, &len))) return false;
    r->p.grammar = r->grammar_text ? r->grammar_text : r->grammar_arg;
    r->p.json_schema = r->schema_text ? r->schema_text : r->schema_arg;
    return true;
}

static void print_default(FILE *f, const num_opt *o, const muser_sampling_params *d) {
    const char *field = (const char *)d + o->offset;
    char names[48];
    snprintf(names, sizeof names, "%s%s%s N", o->name, o->alias ? ", " : "", o->alias ? o->alias : "");
    fprintf(f, "  %-34s %s (default ", names, o->help);
    if (o->is_float) {
        float v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%g)\n", (double)v);
    } else {
        int32_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%d)\n", v);
    }
}

void run_sampling_usage(FILE *f) {
    muser_sampling_params d;
    muser_sampling_params_default(&d);
    mu_sampler_params sd;
    mu_sampler_params_default(&sd);
    char names[256], letters[MU_SAMPLER_MAX_ORDER + 1];
    mu_sampler_order_names(sd.order, sd.n_order, names, sizeof names);
    mu_sampler_order_chars(sd.order, sd.n_order, letters, sizeof letters);
    fprintf(f,
            "\nsampling (llama.cpp's chain, names and defaults; see docs/sampling.md):\n"
            "  %-34s chain order, names separated by ';'\n"
            "  %-34s   (default %s)\n"
            "  %-34s chain order as letters (default %s)\n"
            "  %-34s RNG seed; -1 = random, the resolved seed is in --json (default -1)\n",
            "--samplers NAMES", "", names, "--sampling-seq LETTERS", letters, "-s, --seed N");
    for (size_t k = 0; k < sizeof NUM_OPTS / sizeof NUM_OPTS[0]; k++) print_default(f, &NUM_OPTS[k], &d);
    fprintf(f,
            "  %-34s add BIAS to a token's logit, e.g. 15043+1, 15043-inf (repeatable; default none)\n"
            "  %-34s DRY breaker; the first replaces the defaults, 'none' clears\n"
            "  %-34s   (repeatable; default '\\n' ':' '\"' '*')\n"
            "  %-34s never draw end-of-generation tokens (default off)\n"
            "  %-34s constrain the output with a GBNF grammar (default none)\n"
            "  %-34s read the GBNF grammar from FILE\n"
            "  %-34s constrain the output with a JSON Schema (default none)\n"
            "  %-34s read the JSON Schema from FILE\n",
            "-l, --logit-bias TOKEN(+|-)BIAS", "--dry-sequence-breaker TEXT", "", "--ignore-eos",
            "--grammar GBNF", "--grammar-file FILE", "-j, --json-schema SCHEMA", "-jf, --json-schema-file FILE");
}

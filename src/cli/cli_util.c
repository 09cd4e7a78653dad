#include "cli.h"
#include "util/common.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_error(const char *cmd, const char *msg) {
    const size_t n = strlen(cmd);
    if (!strncmp(msg, cmd, n) && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
    fprintf(stderr, "muser %s: %s\n", cmd, msg);
}

bool cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "muser %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, flag,
                (long long)lo, (long long)hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "muser %s: %s expects a non-negative integer, got '%s'\n", cmd, flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_f32(const char *cmd, const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "muser %s: %s expects a finite number, got '%s'\n", cmd, flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_value(const char *cmd, int argc, char **argv, int *i, const char **out) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "muser %s: %s needs a value\n", cmd, argv[*i]);
        return false;
    }
    *out = argv[++*i];
    return true;
}

bool cli_parse_ids(const char *cmd, const char *what, const char *s, int32_t **ids, int64_t *n) {
    int64_t cap = 16, count = 0;
    int32_t *v = mu_xmalloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "muser %s: %s expects comma-separated non-negative integers, bad at '%s'\n", cmd, what, p);
            free(v);
            return false;
        }
        if (count == cap) v = mu_xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[count++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!count) {
        fprintf(stderr, "muser %s: %s is empty\n", cmd, what);
        free(v);
        return false;
    }
    *ids = v;
    *n = count;
    return true;
}

void cli_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

void cli_progress(const char *label, uint64_t done, uint64_t total, double t0) {
    /* Redrawn in place on a terminal; a log file gets only the final line. */
    const bool tty = isatty(STDERR_FILENO);
    if (!tty && done < total) return;
    double dt = mu_now() - t0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    double mbs = dt > 0 ? (double)done / dt / 1e6 : 0;
    int filled = (int)(pct / 4);
    char bar[26];
    for (int i = 0; i < 25; i++) bar[i] = i < filled ? '#' : '.';
    bar[25] = 0;
    fprintf(stderr, "%s%s [%s] %5.1f%% %8.1f MB %7.1f MB/s", tty ? "\r" : "", label, bar, pct, (double)done / 1e6, mbs);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

bool cli_model_or_default(const char *cmd, const char **model) {
    if (!*model) *model = getenv("MUSER_MODEL");
#ifdef MUSER_DEFAULT_MODEL
    if (!*model) *model = MUSER_DEFAULT_MODEL;
#endif
    if (!*model) fprintf(stderr, "muser %s: -m MODEL is required\n", cmd);
    return *model != NULL;
}

/* The assistant that goes with the default model: $MUSER_DRAFT, else the
 * shipped one when the model is the shipped one too ($MUSER_MODEL unset).
 * NULL if there is none (a missing shipped file is noted, not an error). */
const char *cli_default_draft(void) {
    const char *d = getenv("MUSER_DRAFT");
    if (d) return d;
#ifdef MUSER_DEFAULT_DRAFT
    if (getenv("MUSER_MODEL")) return NULL;
    if (access(MUSER_DEFAULT_DRAFT, R_OK) == 0) return MUSER_DEFAULT_DRAFT;
    fprintf(stderr, "muser: note: the shipped assistant %s is missing; decoding without it\n", MUSER_DEFAULT_DRAFT);
#endif
    return NULL;
}

bool cli_parse_verify_len(const char *cmd, const char *v, int64_t *out) {
    if (!cli_parse_i64(cmd, "--verify-len", v, 3, 15, out)) return false;
    if (*out == 3 || *out == 7 || *out == 15) return true;
    fprintf(stderr, "muser %s: --verify-len must be 3, 7 or 15, got %s\n", cmd, v);
    return false;
}

bool cli_parse_backend(const char *cmd, const char *v, muser_backend_kind *out) {
    if (muser_backend_from_name(v, out)) return true;
    fprintf(stderr, "muser %s: unknown backend '%s' (ref, cpu, cuda, auto)\n", cmd, v);
    return false;
}

bool cli_parse_compress(const char *cmd, const char *s, int *level) {
    if (!strcmp(s, "none")) {
        *level = 0;
        return true;
    }
    if (!strcmp(s, "zstd")) {
        *level = 3; /* zstd's own default level */
        return true;
    }
    char *end = NULL;
    long v = !strncmp(s, "zstd:", 5) && s[5] ? strtol(s + 5, &end, 10) : 0;
    if (!end || *end || v < 1 || v > 19) {
        fprintf(stderr, "muser %s: --compress expects none, zstd or zstd:LEVEL with LEVEL 1 to 19, got '%s'\n", cmd, s);
        return false;
    }
    *level = (int)v;
    return true;
}

/* Bench reports: a JSON document with a fixed key order (two runs diff
 * line by line) and a PNG plot of tokens/s against context depth. */
#include "bench/bench.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- JSON */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* "[a, b, ...]" with `decimals` digits after the point. */
static void json_samples(FILE *f, const mu_bench_stats *s, int decimals) {
    fputc('[', f);
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%.*f", i ? ", " : "", decimals, s->samples[i]);
    fputc(']', f);
}

static void json_stats(FILE *f, const char *indent, const mu_bench_stats *s) {
    fprintf(f, "%s\"tok_s\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f, \"mean\": %.4f, \"cv\": %.6f},\n", indent,
            s->median, s->min, s->max, s->mean, s->cv);
    fprintf(f, "%s\"samples\": ", indent);
    json_samples(f, s, 4);
}

static void json_values(FILE *f, const char *name, const mu_bench_stats *s) {
    fprintf(f, ",\n        \"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f, \"samples\": ", name, s->median,
            s->min, s->max);
    json_samples(f, s, 3);
    fputc('}', f);
}

/* The bandwidth passes around the decode repetitions, and each repetition's share. */
static void json_paired(FILE *f, const mu_bench_depth *d) {
    json_values(f, "paired_membw_gbs", &d->paired_membw);
    json_values(f, "pct_paired_membw", &d->paired_share);
}

bool mu_bench_write_json(const char *path, const mu_bench_opts *o, const mu_bench_result *r, mu_error *err) {
    FILE *f = !strcmp(path, "-") ? stdout : fopen(path, "w");
    if (!f) {
        mu_err_set(err, "bench: cannot write %s: %s", path, strerror(errno));
        return false;
    }
    const muser_model_info *m = &r->info;
    fprintf(f, "{\n  \"muser_bench\": 1,\n  \"model\": {\n    \"path\": ");
    json_str(f, o->model_path);
    fprintf(f, ",\n    \"name\": ");
    json_str(f, r->model_name);
    fprintf(f, ",\n    \"lane\": ");
    json_str(f, r->lane);
    fprintf(f, ",\n    \"n_layer\": %lld,\n    \"n_embd\": %lld,\n    \"n_vocab\": %lld,\n", (long long)m->n_layer,
            (long long)m->n_embd, (long long)m->n_vocab);
    fprintf(f, "    \"file_bytes\": %llu,\n    \"weight_bytes_per_token\": %llu\n  },\n",
            (unsigned long long)m->file_bytes, (unsigned long long)m->weight_bytes_per_token);
    fprintf(f, "  \"backend\": ");
    json_str(f, r->backend);
    fprintf(f, ",\n  \"isa\": ");
    json_str(f, r->isa);
    fprintf(f, ",\n  \"threads\": %d,\n", r->n_threads);
    fprintf(f, "  \"params\": {\"n_prompt\": %lld, \"n_gen\": %lld, \"reps\": %d, \"warmup\": %d, \"chunk\": %lld, "
               "\"depth_fill\": \"%s\", \"pause_s\": %.3f, \"mlock\": %s, \"interleave\": %s},\n",
            (long long)o->n_prompt, (long long)o->n_gen, o->reps, o->warmup, (long long)(o->chunk > 0 ? o->chunk : 512),
            o->prefill_depth ? "prefill" : "synthetic", o->pause_s, o->use_mlock ? "true" : "false",
            o->interleave ? "true" : "false");
    fprintf(f, "  \"membw_gbs\": %.3f,\n  \"membw_of\": \"%s\",\n  \"results\": [\n", r->membw_gbs,
            r->membw_of ? r->membw_of : "");
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_depth *d = &r->depths[i];
        fprintf(f, "    {\n      \"depth\": %lld", (long long)d->depth);
        if (d->prefill.n) {
            fprintf(f, ",\n      \"prefill\": {\n        \"tokens\": %lld,\n", (long long)o->n_prompt);
            json_stats(f, "        ", &d->prefill);
            fprintf(f, "\n      }");
        }
        if (d->decode.n) {
            const double gbs = d->decode.median * (double)m->weight_bytes_per_token / 1e9;
            fprintf(f, ",\n      \"decode\": {\n        \"tokens\": %lld,\n        \"chain\": %s,\n",
                    (long long)o->n_gen, o->chain ? "true" : "false");
            json_stats(f, "        ", &d->decode);
            fprintf(f, ",\n        \"weight_gbs\": %.3f,\n        \"pct_membw\": %.2f", gbs,
                    r->membw_gbs > 0 ? 100.0 * gbs / r->membw_gbs : 0.0);
            if (d->paired_share.n) json_paired(f, d);
            fprintf(f, "\n      }");
        }
        fprintf(f, "\n    }%s\n", i + 1 < r->n_depths ? "," : "");
    }
    fprintf(f, "  ]");
    const mu_bench_spec *sp = &r->spec;
    if (sp->ran) {
        fprintf(f, ",\n  \"speculative\": {\n    \"draft\": ");
        json_str(f, sp->draft_name);
        fprintf(f, ",\n    \"verify_len\": %d,\n    \"tree\": %s,\n    \"prompt_tokens\": %lld,\n    \"tokens\": %lld,\n"
                "    \"prompts\": %d,\n",
                sp->verify_len, sp->tree ? "true" : "false", (long long)sp->n_prompt, (long long)sp->n_gen, sp->n_prompts);
        fprintf(f, "    \"plain\": {\n");
        json_stats(f, "      ", &sp->plain);
        fprintf(f, "\n    },\n    \"spec\": {\n");
        json_stats(f, "      ", &sp->spec);
        fprintf(f, "\n    },\n    \"speedup\": %.4f,\n    \"tokens_per_round\": %.4f,\n    \"acceptance\": %.4f,\n"
                   "    \"exact\": true\n  }",
                sp->plain.median > 0 ? sp->spec.median / sp->plain.median : 0.0,
                sp->rounds ? (double)sp->round_tokens / (double)sp->rounds : 0.0,
                sp->drafted ? (double)sp->accepted / (double)sp->drafted : 0.0);
    }
    if (r->n_parallel) {
        fprintf(f, ",\n  \"parallel\": [\n");
        for (int i = 0; i < r->n_parallel; i++) {
            const mu_bench_parallel *p = &r->parallel[i];
            fprintf(f, "    {\n      \"sequences\": %lld,\n      \"depth\": %lld,\n      \"tokens\": %lld,\n",
                    (long long)p->n_seq, (long long)o->parallel_depth, (long long)(o->n_gen > 0 ? o->n_gen : 128));
            json_stats(f, "      ", &p->aggregate);
            fprintf(f, ",\n      \"x_one_sequence\": %.4f,\n      \"x_one_sequence_min\": %.4f,\n"
                       "      \"x_one_sequence_max\": %.4f\n    }%s\n",
                    p->ratio.median, p->ratio.min, p->ratio.max, i + 1 < r->n_parallel ? "," : "");
        }
        fprintf(f, "  ]");
    }
    fprintf(f, "\n}\n");
    bool ok = !ferror(f);
    if (f != stdout && fclose(f) != 0) ok = false;
    if (!ok) mu_err_set(err, "bench: write error on %s", path);
    return ok;
}

/* ---------------------------------------------------------------- plot */

enum { W = 800, H = 580, COL_BG = 0, COL_AXIS, COL_GRID, COL_DECODE, COL_PREFILL, COL_TEXT };
static const uint8_t PALETTE[] = {255, 255, 255, 40, 40, 40, 222, 222, 222, 31, 119, 180, 255, 127, 14, 90, 90, 90};

/* 5x7 glyphs (bit 4 = leftmost column) for the characters the plot prints. */
typedef struct glyph {
    char c;
    uint8_t rows[7];
} glyph;

static const glyph FONT[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},     {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {30, 1, 1, 14, 1, 1, 30}},     {'4', {2, 6, 10, 18, 31, 2, 2}},    {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},      {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'.', {0, 0, 0, 0, 0, 12, 12}},     {'/', {1, 2, 2, 4, 8, 8, 16}},
    {'-', {0, 0, 0, 31, 0, 0, 0}},       {'(', {2, 4, 8, 8, 8, 4, 2}},       {')', {8, 4, 2, 2, 2, 4, 8}},
    {'%', {24, 25, 2, 4, 8, 19, 3}},     {',', {0, 0, 0, 0, 12, 4, 8}},      {':', {0, 12, 12, 0, 12, 12, 0}},
    {'=', {0, 0, 31, 0, 31, 0, 0}},      {'_', {0, 0, 0, 0, 0, 0, 31}},      {'a', {0, 0, 14, 1, 15, 17, 15}},
    {'b', {16, 16, 22, 25, 17, 17, 30}}, {'c', {0, 0, 14, 16, 16, 17, 14}},  {'d', {1, 1, 13, 19, 17, 17, 15}},
    {'e', {0, 0, 14, 17, 31, 16, 14}},   {'f', {6, 9, 8, 28, 8, 8, 8}},      {'g', {0, 15, 17, 17, 15, 1, 14}},
    {'h', {16, 16, 22, 25, 17, 17, 17}}, {'i', {4, 0, 12, 4, 4, 4, 14}},     {'k', {16, 16, 18, 20, 24, 20, 18}},
    {'l', {12, 4, 4, 4, 4, 4, 14}},      {'m', {0, 0, 26, 21, 21, 17, 17}},  {'n', {0, 0, 22, 25, 17, 17, 17}},
    {'o', {0, 0, 14, 17, 17, 17, 14}},   {'p', {0, 0, 30, 17, 30, 16, 16}},  {'q', {0, 0, 13, 19, 15, 1, 1}},
    {'r', {0, 0, 22, 25, 16, 16, 16}},   {'s', {0, 0, 14, 16, 14, 1, 30}},   {'t', {8, 8, 28, 8, 8, 9, 6}},
    {'u', {0, 0, 17, 17, 17, 19, 13}},   {'v', {0, 0, 17, 17, 17, 10, 4}},   {'w', {0, 0, 17, 17, 21, 21, 10}},
    {'x', {0, 0, 17, 10, 4, 10, 17}},    {'y', {0, 0, 17, 17, 15, 1, 14}},   {'z', {0, 0, 31, 2, 4, 8, 31}},
};

typedef struct canvas {
    uint8_t px[W * H];
} canvas;

static void put(canvas *c, int x, int y, uint8_t col) {
    if (x >= 0 && x < W && y >= 0 && y < H) c->px[y * W + x] = col;
}

static void line(canvas *c, int x0, int y0, int x1, int y1, uint8_t col, int thick) {
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, e = dx + dy;
    for (;;) {
        for (int a = 0; a < thick; a++)
            for (int b = 0; b < thick; b++) put(c, x0 + a - thick / 2, y0 + b - thick / 2, col);
        if (x0 == x1 && y0 == y1) return;
        int e2 = 2 * e;
        if (e2 >= dy) { e += dy; x0 += sx; }
        if (e2 <= dx) { e += dx; y0 += sy; }
    }
}

/* Text at (x, y) = top left, 2x scaled glyphs, lower-cased. */
static int text(canvas *c, int x, int y, const char *s, uint8_t col) {
    for (; *s; s++, x += 12) {
        char ch = (char)(*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s);
        for (size_t g = 0; g < sizeof FONT / sizeof FONT[0]; g++) {
            if (FONT[g].c != ch) continue;
            for (int r = 0; r < 7; r++)
                for (int b = 0; b < 5; b++)
                    if (FONT[g].rows[r] >> (4 - b) & 1)
                        for (int k = 0; k < 4; k++) put(c, x + 2 * b + k % 2, y + 2 * r + k / 2, col);
        }
    }
    return x;
}

static void depth_label(char *buf, size_t n, int64_t d) {
    if (d >= 1024 && d % 1024 == 0) snprintf(buf, n, "%lldk", (long long)(d / 1024));
    else snprintf(buf, n, "%lld", (long long)d);
}

/* One panel: a series of medians with min-max bars over evenly spaced depths. */
static void panel(canvas *c, int top, int bottom, const char *title, const mu_bench_result *r, bool decode, uint8_t col) {
    const int left = 100, right = W - 30;
    double ymax = 0;
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_stats *s = decode ? &r->depths[i].decode : &r->depths[i].prefill;
        if (s->n && s->max > ymax) ymax = s->max;
    }
    text(c, left, top - 22, title, COL_TEXT);
    if (ymax <= 0) {
        text(c, left + 20, (top + bottom) / 2, "not measured", COL_TEXT);
        return;
    }
    ymax *= 1.15;
    for (int g = 0; g <= 4; g++) {
        int y = bottom - (bottom - top) * g / 4;
        line(c, left, y, right, y, COL_GRID, 1);
        char lab[32];
        snprintf(lab, sizeof lab, ymax >= 100 ? "%.0f" : "%.1f", ymax * g / 4);
        text(c, left - 12 * (int)strlen(lab) - 8, y - 7, lab, COL_TEXT);
    }
    line(c, left, top, left, bottom, COL_AXIS, 2);
    line(c, left, bottom, right, bottom, COL_AXIS, 2);
    int px = -1, py = -1;
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_stats *s = decode ? &r->depths[i].decode : &r->depths[i].prefill;
        int x = r->n_depths == 1 ? (left + right) / 2 : left + 40 + (right - left - 80) * i / (r->n_depths - 1);
        char lab[32];
        depth_label(lab, sizeof lab, r->depths[i].depth);
        text(c, x - 6 * (int)strlen(lab), bottom + 8, lab, COL_TEXT);
        if (!s->n) continue;
        int y = bottom - (int)((bottom - top) * s->median / ymax);
        int ylo = bottom - (int)((bottom - top) * s->min / ymax), yhi = bottom - (int)((bottom - top) * s->max / ymax);
        line(c, x, ylo, x, yhi, col, 1);
        line(c, x - 5, ylo, x + 5, ylo, col, 1);
        line(c, x - 5, yhi, x + 5, yhi, col, 1);
        if (px >= 0) line(c, px, py, x, y, col, 2);
        for (int a = -3; a <= 3; a++)
            for (int b = -3; b <= 3; b++) put(c, x + a, y + b, col);
        px = x;
        py = y;
    }
}

bool mu_bench_write_plot(const char *path, const mu_bench_result *r, mu_error *err) {
    canvas *c = mu_xcalloc(1, sizeof *c);
    char title[256];
    snprintf(title, sizeof title, "%s  (%s %s, %d threads)", r->model_name, r->backend, r->isa, r->n_threads);
    text(c, 20, 12, title, COL_AXIS);
    panel(c, 70, 270, "decode tok/s vs context depth", r, true, COL_DECODE);
    panel(c, 340, 520, "prefill tok/s vs context depth", r, false, COL_PREFILL);
    text(c, W / 2 - 60, H - 18, "depth (tokens)", COL_TEXT);
    bool ok = mu_png_write_indexed(path, c->px, W, H, PALETTE, (int)(sizeof PALETTE / 3), err);
    free(c);
    return ok;
}

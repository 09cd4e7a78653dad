/* The list of tensors a tool writes, their companions, and the output file. */
#include "tools/tools_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void mu_plan_free(mu_plan *p) {
    for (int64_t i = 0; i < p->n; i++) free(p->t[i].name);
    free(p->t);
    memset(p, 0, sizeof *p);
}

static int64_t plan_push(mu_plan *p, const char *name, mu_out_kind kind, uint32_t type,
                         uint32_t n_dims, uint64_t ne0, uint64_t ne1) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->t = mu_xrealloc(p->t, (size_t)p->cap * sizeof *p->t);
    }
    mu_out_tensor *t = &p->t[p->n];
    memset(t, 0, sizeof *t);
    t->name = mu_xstrdup(name);
    t->kind = kind;
    t->type = type;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->n_in = ne0;
    t->n_rows = ne1;
    t->companion = -1;
    t->scalar = -1;
    t->writer_idx = -1;
    t->src = -1;
    t->mean = 1.0f;
    uint64_t rb = 0;
    mu_type_row_bytes(type, ne0, &rb); /* callers have checked divisibility */
    t->row_bytes = rb;
    return p->n++;
}

int64_t mu_plan_add_vector(mu_plan *p, const char *name, uint64_t n) {
    return plan_push(p, name, MU_OUT_VECTOR, MU_TYPE_F32, 1, n, 1);
}

static char *suffixed(const char *name, const char *suffix) {
    size_t a = strlen(name), b = strlen(suffix);
    char *s = mu_xmalloc(a + b + 1);
    memcpy(s, name, a);
    memcpy(s + a, suffix, b + 1);
    return s;
}

/* Width check for `type`: NVFP4 native needs whole 16-value scale groups. */
static bool check_width(const char *name, uint32_t type, uint64_t n_in, mu_error *err) {
    uint32_t be = 1, bb = 0;
    if (!mu_type_size(type, &be, &bb)) {
        mu_err_set(err, "tensor %s: unknown target type %u", name, type);
        return false;
    }
    if (type == MU_TYPE_NVFP4_E2M1) be = 16;
    if (n_in == 0 || n_in % be) {
        mu_err_set(err, "tensor %s: row width %llu is not a multiple of the %s block (%u values)",
                   name, (unsigned long long)n_in, mu_type_name(type), be);
        return false;
    }
    return true;
}

int64_t mu_plan_add_weight(mu_plan *p, const mu_target *t, const char *name,
                           uint64_t n_in, uint64_t n_rows, mu_error *err) {
    uint32_t type = mu_target_weight_type(t, name);
    if (!check_width(name, type, n_in, err)) return -1;
    if (type == MU_TYPE_NVFP4_E2M1) {
        int64_t w = plan_push(p, name, MU_OUT_NVFP4, type, 2, n_in, n_rows);
        char *sn = suffixed(name, ".nvfp4_scale"), *s2 = suffixed(name, ".nvfp4_scale2");
        int64_t sc = plan_push(p, sn, MU_OUT_SCALES, MU_TYPE_F8_E4M3FN, 2, n_in / 16, n_rows);
        int64_t sv = plan_push(p, s2, MU_OUT_SCALAR, MU_TYPE_F32, 1, 1, 1);
        free(sn);
        free(s2);
        p->t[w].companion = sc;
        p->t[w].scalar = sv;
        return w;
    }
    int64_t w = plan_push(p, name, MU_OUT_MATRIX, type, 2, n_in, n_rows);
    if (type == MU_TYPE_NVFP4) {
        char *sn = suffixed(name, ".scale");
        int64_t sv = plan_push(p, sn, MU_OUT_SCALAR, MU_TYPE_F32, 1, 1, 1);
        free(sn);
        p->t[w].scalar = sv;
    }
    return w;
}

void mu_plan_add_to_writer(mu_plan *p, gguf_writer *w) {
    for (int64_t i = 0; i < p->n; i++) {
        mu_out_tensor *t = &p->t[i];
        t->writer_idx = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
    }
}

uint64_t mu_plan_bytes(const mu_plan *p) {
    uint64_t total = 0;
    for (int64_t i = 0; i < p->n; i++) total += p->t[i].row_bytes * p->t[i].n_rows;
    return total;
}

mu_job *mu_plan_jobs(const mu_plan *p, bool (*want)(const mu_out_tensor *t),
                     uint64_t chunk_bytes, size_t *n_jobs, uint64_t *total_bytes) {
    size_t n = 0, cap = 256;
    mu_job *jobs = mu_xmalloc(cap * sizeof *jobs);
    uint64_t total = 0;
    for (int64_t i = 0; i < p->n; i++) {
        const mu_out_tensor *t = &p->t[i];
        if (!want(t)) continue;
        /* A native NVFP4 job also writes the rows of its scale tensor. */
        uint64_t row_bytes = t->row_bytes + (t->companion >= 0 ? p->t[t->companion].row_bytes : 0);
        uint64_t rows_per_job = row_bytes ? chunk_bytes / row_bytes : t->n_rows;
        if (rows_per_job == 0) rows_per_job = 1;
        for (uint64_t r = 0; r < t->n_rows; r += rows_per_job) {
            if (n == cap) jobs = mu_xrealloc(jobs, (cap *= 2) * sizeof *jobs);
            uint64_t r1 = r + rows_per_job < t->n_rows ? r + rows_per_job : t->n_rows;
            jobs[n] = (mu_job){i, r, r1, (r1 - r) * row_bytes};
            total += jobs[n].bytes;
            n++;
        }
    }
    *n_jobs = n;
    if (total_bytes) *total_bytes = total;
    return jobs;
}

bool mu_pwrite_all(int fd, const void *buf, uint64_t n, uint64_t offset,
                   const char *what, mu_error *err) {
    const uint8_t *b = buf;
    while (n > 0) {
        size_t step = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = pwrite(fd, b, step, (off_t)offset);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            mu_err_set(err, "writing %s at file offset %llu: %s", what,
                       (unsigned long long)offset, k < 0 ? strerror(errno) : "no progress");
            return false;
        }
        b += k;
        n -= (uint64_t)k;
        offset += (uint64_t)k;
    }
    return true;
}

bool mu_plan_write_scalars(const mu_plan *p, gguf_writer *w, const char *path, mu_error *err) {
    for (int64_t i = 0; i < p->n; i++) {
        const mu_out_tensor *t = &p->t[i];
        if (t->kind != MU_OUT_SCALAR) continue;
        uint8_t b[4];
        memcpy(b, &t->scalar_value, 4);
        if (!mu_pwrite_all(gguf_writer_fd(w), b, 4, gguf_writer_tensor_file_offset(w, t->writer_idx),
                           t->name, err)) {
            mu_err_prefix(err, "%s", path);
            return false;
        }
    }
    return true;
}

double mu_tools_sqrt(double x) {
    if (!(x > 0)) return 0;
    double r = x > 1 ? x : 1;
    for (int i = 0; i < 200; i++) {
        double next = 0.5 * (r + x / r);
        if (next >= r) break; /* converged: Newton from above decreases monotonically */
        r = next;
    }
    return r;
}

double mu_tools_e4m3_value(uint8_t b) {
    int e = (b >> 3) & 0xF, m = b & 7;
    double v = e ? (1.0 + m / 8.0) : m / 8.0;
    int shift = e ? e - 7 : -6;
    for (; shift > 0; shift--) v *= 2;
    for (; shift < 0; shift++) v *= 0.5;
    return (b & 0x80) ? -v : v;
}

uint64_t mu_hash_str(const char *s) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return mu_mix64(h);
}

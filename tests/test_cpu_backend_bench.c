/* `muser bench` library: statistics, the PNG writer (chunk CRCs, stored
 * deflate, Adler-32 checked by decoding the file again here), the JSON
 * report (parsed back with jansson), a bandwidth figure, and a tiny run of
 * the runner on both backends, including a synthetic and a prefilled depth. */
#include "testutil.h"
#include "model_fixture.h"
#include "bench/bench.h"
#include <jansson.h>
#include <math.h>

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static uint32_t crc32_ref(const uint8_t *p, size_t n) { /* bitwise, independent of the writer's table */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return c ^ 0xFFFFFFFFu;
}

static void test_stats(void) {
    const double v[] = {4, 1, 3, 2, 5};
    mu_bench_stats s;
    mu_bench_stats_compute(&s, v, 5);
    CHECK(s.median == 3 && s.min == 1 && s.max == 5 && s.mean == 3);
    CHECK(fabs(s.cv - sqrt(2.5) / 3) < 1e-12);
    free(s.samples);
    const double w[] = {2, 4};
    mu_bench_stats_compute(&s, w, 2);
    CHECK(s.median == 3);
    free(s.samples);
}

/* Write a small image, read it back: chunk CRCs, then inflate the stored
 * blocks and compare pixels and the Adler-32. */
static void test_png(void) {
    enum { WD = 70, HT = 1000 }; /* > 65535 bytes: several stored blocks */
    uint8_t *px = malloc(WD * HT), pal[6] = {0, 0, 0, 255, 255, 255};
    for (int i = 0; i < WD * HT; i++) px[i] = (uint8_t)((i * 7 / 3) & 1);
    char path[256];
    snprintf(path, sizeof path, "%s/t.png", fx_tmpdir());
    mu_error err;
    CHECK_MSG(mu_png_write_indexed(path, px, WD, HT, pal, 2, &err), "%s", err.msg);
    FILE *f = fopen(path, "rb");
    static uint8_t buf[200000];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n > 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8));
    uint8_t *raw = malloc((WD + 1) * HT);
    size_t raw_n = 0, off = 8;
    bool idat_ok = false;
    while (off + 12 <= n) {
        uint32_t len = be32(buf + off);
        const uint8_t *type = buf + off + 4, *data = buf + off + 8;
        CHECK_MSG(be32(data + len) == crc32_ref(type, len + 4), "chunk %.4s CRC", (const char *)type);
        if (!memcmp(type, "IDAT", 4)) {
            size_t i = 2; /* zlib header */
            for (bool last = false; !last && i < len;) {
                last = data[i] & 1;
                uint16_t bl = (uint16_t)(data[i + 1] | data[i + 2] << 8), nl = (uint16_t)(data[i + 3] | data[i + 4] << 8);
                CHECK((uint16_t)(bl ^ nl) == 0xFFFF);
                memcpy(raw + raw_n, data + i + 5, bl);
                raw_n += bl;
                i += 5 + bl;
            }
            uint32_t a = 1, b = 0;
            for (size_t k = 0; k < raw_n; k++) { a = (a + raw[k]) % 65521; b = (b + a) % 65521; }
            idat_ok = be32(data + i) == (b << 16 | a);
        }
        off += 12 + len;
    }
    CHECK(idat_ok);
    CHECK_EQ_INT(raw_n, (WD + 1) * HT);
    for (int y = 0; y < HT && raw_n == (size_t)(WD + 1) * HT; y++) {
        CHECK(raw[y * (WD + 1)] == 0);
        CHECK(!memcmp(raw + y * (WD + 1) + 1, px + y * WD, WD));
    }
    free(raw);
    free(px);
}

static void test_run(muser_backend_kind kind, bool prefill_depth) {
    const int64_t depths[] = {0, 40};
    mu_bench_opts o;
    mu_bench_opts_init(&o);
    o.model_path = fx_synth("q4_k_xl", 9, 32);
    o.backend = kind;
    o.n_threads = 2;
    o.n_prompt = 9;
    o.n_gen = 4;
    o.reps = 2;
    o.depths = depths;
    o.n_depths = 2;
    o.prefill_depth = prefill_depth;
    o.membw_gbs = 10.0;
    mu_bench_result r;
    mu_error err;
    bool ok = mu_bench_run(&o, &r, &err);
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) return;
    CHECK_EQ_INT(r.n_depths, 2);
    for (int i = 0; i < r.n_depths; i++) {
        CHECK(r.depths[i].prefill.n == 2 && r.depths[i].prefill.min > 0 && r.depths[i].prefill.median >= r.depths[i].prefill.min);
        CHECK(r.depths[i].decode.n == 2 && r.depths[i].decode.max >= r.depths[i].decode.median);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/b.json", fx_tmpdir());
    CHECK_MSG(mu_bench_write_json(path, &o, &r, &err), "%s", err.msg);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK_MSG(j != NULL, "bench JSON does not parse: %s", je.text);
    if (j) {
        json_t *res = json_object_get(j, "results");
        CHECK(json_array_size(res) == 2);
        json_t *d1 = json_array_get(res, 1);
        CHECK(json_integer_value(json_object_get(d1, "depth")) == 40);
        json_t *dec = json_object_get(d1, "decode");
        CHECK(json_real_value(json_object_get(dec, "weight_gbs")) > 0);
        CHECK(!strcmp(json_string_value(json_object_get(j, "backend")), kind == MUSER_BACKEND_REF ? "ref" : "cpu"));
        json_decref(j);
    }
    snprintf(path, sizeof path, "%s/b.png", fx_tmpdir());
    CHECK_MSG(mu_bench_write_plot(path, &r, &err), "%s", err.msg);
    mu_bench_result_free(&r);
}

static void test_bad_input(void) {
    mu_bench_opts o;
    mu_bench_opts_init(&o);
    o.model_path = "/nonexistent/model.gguf";
    mu_bench_result r;
    mu_error err;
    CHECK(!mu_bench_run(&o, &r, &err));
    o.model_path = fx_synth("q4_k_xl", 9, 32);
    o.n_prompt = o.n_gen = 0;
    CHECK(!mu_bench_run(&o, &r, &err));
    CHECK(strstr(err.msg, "nothing to measure") != NULL);
}

int main(void) {
    test_stats();
    test_png();
    CHECK(mu_bench_membw(2, 64u << 20, 1) > 0.1);
    test_run(MUSER_BACKEND_CPU, false);
    test_run(MUSER_BACKEND_REF, true);
    test_bad_input();
    fx_cleanup();
    TEST_MAIN_END();
}

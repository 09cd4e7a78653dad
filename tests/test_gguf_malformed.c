/* Every file in tests/malformed/ must be refused by gguf_open with the
 * message substring listed in tests/malformed/EXPECTED.txt and the file's
 * path; gguf_open_memory must refuse the same bytes with the same message.
 * The manifest must list exactly the .gguf files present, so a new file
 * cannot be skipped silently. */
#include "gguf/gguf.h"
#include "testutil.h"
#include <dirent.h>
#include <libgen.h>

#define MAX_ENTRIES 1024

typedef struct entry {
    char name[1024];
    char expect[1024];
    bool seen;
} entry;

static entry entries[MAX_ENTRIES];
static int n_entries;

static void corpus_dir(char *out, size_t cap) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    if (src) {
        snprintf(out, cap, "%s/tests/malformed", src);
        return;
    }
    char here[512];
    snprintf(here, sizeof here, "%s", __FILE__); /* .../tests/test_gguf_malformed.c */
    snprintf(out, cap, "%s/malformed", dirname(here));
}

static bool load_manifest(const char *dir) {
    char path[2048], line[1024];
    snprintf(path, sizeof path, "%s/EXPECTED.txt", dir);
    FILE *fp = fopen(path, "r");
    CHECK_MSG(fp != NULL, "cannot open %s", path);
    if (!fp) return false;
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0') continue;
        char *tab = strchr(line, '\t');
        CHECK_MSG(tab && tab[1], "malformed manifest line: %s", line);
        if (!tab || !tab[1] || n_entries == MAX_ENTRIES) continue;
        *tab = '\0';
        entry *e = &entries[n_entries++];
        snprintf(e->name, sizeof e->name, "%s", line);
        snprintf(e->expect, sizeof e->expect, "%s", tab + 1);
        for (int i = 0; i < n_entries - 1; i++)
            CHECK_MSG(strcmp(entries[i].name, e->name), "listed twice: %s", e->name);
    }
    fclose(fp);
    return true;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(b, 1, (size_t)n, fp);
    fclose(fp);
    return b;
}

static void check_entry(const char *dir, entry *e) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->name);
    mu_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f == NULL, "%s was accepted", e->name);
    gguf_close(f);
    if (f) return;
    CHECK_MSG(strstr(err.msg, e->expect) != NULL, "%s:\n  got      '%s'\n  expected '%s'",
              e->name, err.msg, e->expect);
    CHECK_MSG(strncmp(err.msg, path, strlen(path)) == 0, "%s: message does not start with the path: %s",
              e->name, err.msg);
    /* Exact-size heap copy: ASan flags any read past the end. */
    size_t len = 0;
    uint8_t *b = read_file(path, &len);
    CHECK(b != NULL);
    if (!b) return;
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, b, len);
    mu_error err2 = {{0}};
    f = gguf_open_memory(len ? exact : NULL, len, path, &err2);
    CHECK_MSG(f == NULL, "%s accepted from memory", e->name);
    gguf_close(f);
    CHECK_MSG(!strcmp(err.msg, err2.msg), "%s: file and memory messages differ:\n  %s\n  %s",
              e->name, err.msg, err2.msg);
    free(exact);
    free(b);
}

int main(void) {
    char dir[768];
    corpus_dir(dir, sizeof dir);
    if (!load_manifest(dir)) TEST_MAIN_END();
    CHECK(n_entries >= 40);
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    int n_files = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".gguf")) continue;
        n_files++;
        entry *e = NULL;
        for (int i = 0; i < n_entries && !e; i++)
            if (!strcmp(entries[i].name, de->d_name)) e = &entries[i];
        CHECK_MSG(e != NULL, "%s is not listed in EXPECTED.txt", de->d_name);
        if (!e) continue;
        e->seen = true;
        check_entry(dir, e);
    }
    if (d) closedir(d);
    for (int i = 0; i < n_entries; i++)
        CHECK_MSG(entries[i].seen, "EXPECTED.txt lists %s, which does not exist", entries[i].name);
    printf("%d malformed files refused as expected\n", n_files);
    TEST_MAIN_END();
}

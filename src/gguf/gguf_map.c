/* The GGUF file's mapping (gguf.h): a read-only private file mapping that
 * starts on a 2 MiB boundary and owns a span rounded up to 2 MiB, so that
 * gguf_make_resident can later swap in anonymous memory backed by
 * transparent huge pages at the very same addresses (every weight pointer
 * stays valid, and huge pages need 2 MiB-aligned virtual addresses). */
#include "gguf/gguf_internal.h"
#include "util/hugemap.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_PIECE ((uint64_t)64 << 20)

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

int gguf_open_regular(const char *path, uint64_t *size, mu_error *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        mu_err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        mu_err_set(err, "%s: is not a regular file (%s)", path, kind_of(st.st_mode));
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        mu_err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        mu_err_set(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        mu_err_set(err, "%s: is not a regular file (%s)", path, kind_of(st.st_mode));
        close(fd);
        return -1;
    }
    /* Back to blocking reads: O_NONBLOCK only guarded the open itself. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        mu_err_set(err, "%s: cannot clear O_NONBLOCK: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

const uint8_t *gguf_map_file(int fd, uint64_t size, uint64_t *span, const char *path, mu_error *err) {
    *span = round_up(size, MU_HUGE_PAGE);
    uint8_t *base = mu_map_aligned(*span, true);
    if (!base) {
        mu_err_set(err, "%s: cannot reserve %" PRIu64 " bytes of address space: %s", path, *span, strerror(errno));
        return NULL;
    }
    if (mmap(base, (size_t)size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        mu_err_set(err, "%s: mmap of %" PRIu64 " bytes failed: %s", path, size, strerror(errno));
        munmap(base, (size_t)*span);
        return NULL;
    }
    return base;
}

/* MemAvailable in bytes (0 if unknown). */
static uint64_t mem_available(void) {
    FILE *m = fopen("/proc/meminfo", "r");
    if (!m) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, m))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(m);
    return (uint64_t)kb * 1024;
}

bool gguf_make_resident(gguf_file *f) {
    if (!f->mapped || f->resident) return f->resident;
    /* Anonymous memory cannot be dropped and re-read like the file's page
     * cache: a model that does not fit with room to spare stays mapped
     * (still correct, pages come back from the file under pressure). */
    const uint64_t avail = mem_available(), margin = avail / 8 > (512u << 20) ? avail / 8 : (512u << 20);
    if (avail == 0 || f->size + margin > avail) return false;
    uint8_t *copy = mu_map_aligned(f->span, true);
    if (!copy) return false;
    if (mprotect(copy, (size_t)f->span, PROT_READ | PROT_WRITE) != 0) goto fail;
#ifdef MADV_HUGEPAGE
    (void)madvise(copy, (size_t)f->span, MADV_HUGEPAGE); /* optional: 4 KiB pages are only slower */
#endif
    /* By 64 MiB pieces, each source piece unmapped once copied (its page
     * cache stays, unmapped), so the peak stays near one copy of the file. */
    for (uint64_t off = 0; off < f->size; off += COPY_PIECE) {
        const uint64_t n = f->size - off < COPY_PIECE ? f->size - off : COPY_PIECE;
        memcpy(copy + off, f->base + off, (size_t)n);
        (void)madvise((void *)(f->base + off), (size_t)n, MADV_DONTNEED);
    }
    if (mprotect(copy, (size_t)f->span, PROT_READ) != 0) goto fail;
    /* Atomically replaces the file mapping (and the reservation's tail). */
    if (mremap(copy, (size_t)f->span, (size_t)f->span, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)f->base) == MAP_FAILED)
        goto fail;
    f->resident = true;
    return true;
fail:
    munmap(copy, (size_t)f->span);
    return false;
}

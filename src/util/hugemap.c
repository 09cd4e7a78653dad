#include "util/hugemap.h"
#include <stddef.h>
#include <sys/mman.h>

uint8_t *mu_map_aligned(uint64_t span, bool reserve) {
    const uint64_t want = span + MU_HUGE_PAGE; /* room to move the start to a boundary */
    uint8_t *r = mmap(NULL, (size_t)want, reserve ? PROT_NONE : PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | (reserve ? MAP_NORESERVE : 0), -1, 0);
    if (r == MAP_FAILED) return NULL;
    uint8_t *base = (uint8_t *)(((uintptr_t)r + MU_HUGE_PAGE - 1) & ~(uintptr_t)(MU_HUGE_PAGE - 1));
    if (base > r) munmap(r, (size_t)(base - r));
    if (base + span < r + want) munmap(base + span, (size_t)(r + want - (base + span)));
    return base;
}

/* Anonymous mappings that start on a 2 MiB boundary: what transparent huge
 * pages need (used by the GGUF mapping and the KV planes). */
#ifndef MUSER_UTIL_HUGEMAP_H
#define MUSER_UTIL_HUGEMAP_H
#include <stdbool.h>
#include <stdint.h>

#define MU_HUGE_PAGE ((uint64_t)2 << 20)

/* `span` bytes at a 2 MiB boundary; NULL if the kernel refuses. reserve:
 * an inaccessible reservation (PROT_NONE, no swap reserved) to map over
 * later; otherwise zero-filled read-write memory. Release with munmap. */
uint8_t *mu_map_aligned(uint64_t span, bool reserve);

#endif

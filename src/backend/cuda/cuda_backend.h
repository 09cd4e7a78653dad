/* The CUDA backend (docs/cuda.md): backend memory is device memory; each
 * op is an exact twin of the ref backend's (docs/numerics.md). */
#ifndef MUSER_CUDA_BACKEND_H
#define MUSER_CUDA_BACKEND_H
#include "backend/backend.h"

/* NULL with err set when this build has no CUDA backend (configured
 * without nvcc, or MUSER_CUDA=OFF) or when no CUDA device is present
 * ("no CUDA device: cudaGetDeviceCount returned ..."). */
mu_backend *mu_backend_cuda_create(int n_threads, mu_error *err);

#endif

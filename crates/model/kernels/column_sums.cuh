// The last pass of a column sum over rows taken in chunks: column j of
// `out` is the sum of the chunks' f32 partials, added in chunk order (one
// thread a column, no atomics: the same bits every run).
#pragma once

#include "convert.cuh"

template <typename T>
__device__ void sum_partials(const float *partial, T *out, int chunks, int d) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float s = 0.f;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * d + j];
    out[j] = from_f32<T>(s);
}

// A decode step's keys and values into a KV cache at a position read on
// the device (crate::qwen2::LayerKvCache::write_at): `fresh` holds one
// row of hd values per (batch element, kv head), rows = B·kv of them;
// `cache` is [rows, cap, hd] and row r's values go to position *slot. The
// position is not a launch parameter, so that a captured CUDA graph can
// replay the step for the next position. One thread per value.

#include "convert.cuh"

template <typename T>
__device__ void kv_write(T *cache, const T *fresh, const uint32_t *slot, uint64_t rows,
                         uint32_t cap, uint32_t hd) {
    uint32_t at = *slot;
    if (at >= cap) return;  // the host checks; a bad slot writes nothing
    uint64_t n = rows * hd;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / hd, d = i % hd;
        cache[(r * cap + at) * hd + d] = fresh[i];
    }
}

#define KV_WRITE(NAME, T)                                                                          \
    extern "C" __global__ void kv_write_##NAME(T *cache, const T *fresh, const uint32_t *slot,    \
                                               uint64_t rows, uint32_t cap, uint32_t hd) {         \
        kv_write<T>(cache, fresh, slot, rows, cap, hd);                                            \
    }

KV_WRITE(f32, float)
KV_WRITE(bf16, __nv_bfloat16)
KV_WRITE(f16, __half)

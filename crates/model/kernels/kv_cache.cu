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

// Runs of cached positions copied between batch caches (a sequence's keys
// or values kept from an earlier call into the next call's cache,
// crate::batch_cache): copy c (grid row blockIdx.y) moves `len` positions
// of every kv head from slot src_slot of row src_row of `src` [rows, kv,
// src_cap, hd] to slot dst_slot of row dst_row of `dst` [rows, kv,
// dst_cap, hd]. `copies` holds (dst_row, dst_slot, src_row, src_slot,
// len) per copy; the host checks each stays inside both caches.
template <typename T>
__device__ void kv_copy_rows(T *dst, const T *src, const uint32_t *copies, uint32_t kv,
                             uint32_t dst_cap, uint32_t src_cap, uint32_t hd) {
    const uint32_t *c = copies + 5 * (uint64_t)blockIdx.y;
    uint64_t dst_row = c[0], dst_slot = c[1], src_row = c[2], src_slot = c[3], len = c[4];
    uint64_t n = (uint64_t)kv * len * hd;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t d = i % hd, p = (i / hd) % len, h = i / (hd * len);
        dst[((dst_row * kv + h) * dst_cap + dst_slot + p) * hd + d] =
            src[((src_row * kv + h) * src_cap + src_slot + p) * hd + d];
    }
}

#define KV_COPY_ROWS(NAME, T)                                                                      \
    extern "C" __global__ void kv_copy_rows_##NAME(T *dst, const T *src, const uint32_t *copies,  \
                                                   uint32_t kv, uint32_t dst_cap,                  \
                                                   uint32_t src_cap, uint32_t hd) {                \
        kv_copy_rows<T>(dst, src, copies, kv, dst_cap, src_cap, hd);                               \
    }

KV_COPY_ROWS(f32, float)
KV_COPY_ROWS(bf16, __nv_bfloat16)
KV_COPY_ROWS(f16, __half)

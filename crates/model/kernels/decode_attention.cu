// A decode step's attention over a whole KV cache in one launch
// (crate::fixed_step, decode_attention): one query per (batch, head) against
// the keys pads[b] ..= *last of its kv head, *last read on the device so that
// a captured CUDA graph replays the step as the cache fills. It replaces the
// scores product, the bounded softmax, the product with v and the output's
// head transpose, four launches a layer.
//
// One block per (batch b, query head h): each warp walks chunks of 32 keys,
// a lane per key for the dot product, and keeps a running max, sum and
// output (the online softmax); the warps' partial results are combined at
// the end. f32 arithmetic whatever the storage type; a row that sees no key
// gets zeros.
//
// q is the query projection as it comes out of its GEMM: with `q_bias`
// (flag 1, [heads, hd]) its bias is added, and with `cs` (flag 2, [B, hd]:
// cos then sin of row b's position) it is rotated (rotate-half) as it is
// loaded, so the step needs no launches for either.

#include "convert.cuh"

#define DECODE_WARPS 8
#define DECODE_Q_BIAS 1
#define DECODE_Q_ROPE 2
// Head dims up to 32 · DECODE_MAX_PER_LANE.
#define DECODE_MAX_PER_LANE 8

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// q [B, heads, hd], k and v [B, kv_heads, cap, hd], out [B, heads, hd], all
// contiguous.
template <typename T>
__device__ void decode_attention(const T *q, const T *k, const T *v, T *out,
                                 const uint32_t *pads, int n_pads, const uint32_t *last,
                                 int heads, int kv_heads, int cap, int hd, float scale,
                                 const T *q_bias, const T *cs, int flags) {
    __shared__ float q_row[32 * DECODE_MAX_PER_LANE];
    __shared__ float part_m[DECODE_WARPS], part_l[DECODE_WARPS];
    __shared__ float part_o[DECODE_WARPS][32 * DECODE_MAX_PER_LANE];

    const int b = blockIdx.y, h = blockIdx.x;
    const int g = h / (heads / kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int lo = b < n_pads ? (int)pads[b] : 0;
    const int hi = (int)min(*last, (uint32_t)(cap - 1));  // the last key seen
    const T *qr = q + ((long long)b * heads + h) * hd;
    const T *kb = k + ((long long)b * kv_heads + g) * cap * hd;
    const T *vb = v + ((long long)b * kv_heads + g) * cap * hd;
    const T *qb = q_bias + (long long)h * hd;
    const bool biased = flags & DECODE_Q_BIAS;
    if (flags & DECODE_Q_ROPE) {
        const int half = hd / 2;
        for (int c = threadIdx.x; c < half; c += blockDim.x) {
            float a = to_f32(qr[c]), e = to_f32(qr[c + half]);
            if (biased) {
                a += to_f32(qb[c]);
                e += to_f32(qb[c + half]);
            }
            const float co = to_f32(cs[(long long)b * hd + c]);
            const float si = to_f32(cs[(long long)b * hd + half + c]);
            q_row[c] = a * co - e * si;
            q_row[c + half] = e * co + a * si;
        }
    } else {
        for (int c = threadIdx.x; c < hd; c += blockDim.x)
            q_row[c] = to_f32(qr[c]) + (biased ? to_f32(qb[c]) : 0.f);
    }
    __syncthreads();

    float m = -INFINITY, l = 0.f, acc[DECODE_MAX_PER_LANE];
    for (int e = 0; e < DECODE_MAX_PER_LANE; ++e) acc[e] = 0.f;
    for (int j0 = lo + 32 * warp; j0 <= hi; j0 += 32 * DECODE_WARPS) {
        // Lane i scores key j0 + i.
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j <= hi) {
            const T *kr = kb + (long long)j * hd;
            float dot = 0.f;
            for (int c = 0; c < hd; ++c) dot += q_row[c] * to_f32(kr[c]);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(s));  // finite: key j0 is seen
        const float alpha = expf(m - m_new);         // 0 while m is -inf
        const float p = j <= hi ? expf(s - m_new) : 0.f;
        l = l * alpha + warp_sum(p);
        m = m_new;
        for (int e = 0; e < DECODE_MAX_PER_LANE; ++e) acc[e] *= alpha;
        // Each lane owns output dims lane + 32e: add every key's p · v.
        const int n = min(32, hi - j0 + 1);
        for (int i = 0; i < n; ++i) {
            const float pi = __shfl_sync(0xffffffff, p, i);
            const T *vr = vb + (long long)(j0 + i) * hd;
            for (int e = 0; e < DECODE_MAX_PER_LANE; ++e) {
                int c = lane + 32 * e;
                if (c < hd) acc[e] += pi * to_f32(vr[c]);
            }
        }
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    for (int e = 0; e < DECODE_MAX_PER_LANE; ++e) {
        int c = lane + 32 * e;
        if (c < hd) part_o[warp][c] = acc[e];
    }
    __syncthreads();
    // Combine the warps' softmax states; a warp that saw no key has m = -inf.
    float big = -INFINITY;
    for (int w = 0; w < DECODE_WARPS; ++w) big = fmaxf(big, part_m[w]);
    float total = 0.f;
    for (int w = 0; w < DECODE_WARPS; ++w)
        if (part_m[w] != -INFINITY) total += part_l[w] * expf(part_m[w] - big);
    T *orow = out + ((long long)b * heads + h) * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < DECODE_WARPS; ++w)
            if (part_m[w] != -INFINITY) o += part_o[w][c] * expf(part_m[w] - big);
        orow[c] = from_f32<T>(total > 0.f ? o / total : 0.f);
    }
}

#define DECODE_ATTENTION(NAME, T)                                                                  \
    extern "C" __global__ void decode_attention_##NAME(                                           \
        const T *q, const T *k, const T *v, T *out, const uint32_t *pads, int n_pads,              \
        const uint32_t *last, int heads, int kv_heads, int cap, int hd, float scale,               \
        const T *q_bias, const T *cs, int flags) {                                                 \
        decode_attention<T>(q, k, v, out, pads, n_pads, last, heads, kv_heads, cap, hd, scale,     \
                            q_bias, cs, flags);                                                    \
    }

DECODE_ATTENTION(f32, float)
DECODE_ATTENTION(bf16, __nv_bfloat16)
DECODE_ATTENTION(f16, __half)

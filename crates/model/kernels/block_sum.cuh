// The sum of one f32 per thread over a block, for the row kernels.
#pragma once

// The block's sum of v, returned to every thread. blockDim.x is a multiple
// of 32, at most 1024.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // part[] may still be read by an earlier call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? part[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

// The launch of an emulated grid (see cuda_emulation.h).

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_emulation.h"

namespace agentrl_emulation {
thread_local ThreadState self;
thread_local std::vector<PendingStore> pending_stores;
}

using agentrl_emulation::Warp;

extern "C" typedef void (*agentrl_kernel_body)(const void *);

// Runs `body(data)` as every thread of a grid of grid[0..3] blocks of
// block[0..3] threads; returns 0, or 1 for a block of no or over 1024 threads.
extern "C" int agentrl_emulated_launch(const unsigned *grid, const unsigned *block,
                                       agentrl_kernel_body body, const void *data) {
    const dim3 g{grid[0], grid[1], grid[2]}, b{block[0], block[1], block[2]};
    const size_t threads = (size_t)b.x * b.y * b.z;
    const size_t blocks = (size_t)g.x * g.y * g.z;
    if (threads == 0 || threads > 1024) return 1;
    const size_t warps = (threads + 31) / 32;
    // `__shared__` variables are statics: one grid at a time in the process,
    // whichever thread launches it.
    static std::mutex one_grid;
    std::lock_guard<std::mutex> hold(one_grid);
    std::unique_ptr<std::barrier<>> block_barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warp_barriers(warps);
    std::vector<Warp> warp(warps);
    // Barriers that exited threads have left are made anew for each block.
    auto fresh = [&] {
        block_barrier = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
        for (size_t w = 0; w < warps; w++) {
            size_t n = std::min<size_t>(32, threads - 32 * w);
            warp_barriers[w] = std::make_unique<std::barrier<>>((std::ptrdiff_t)n);
            warp[w].barrier = warp_barriers[w].get();
        }
    };
    fresh();
    std::barrier<> between_blocks((std::ptrdiff_t)threads);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (size_t t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            auto &self = agentrl_emulation::self;
            self.thread_idx = {(unsigned)(t % b.x), (unsigned)(t / b.x % b.y),
                               (unsigned)(t / b.x / b.y)};
            self.block_dim = b;
            self.grid_dim = g;
            for (size_t k = 0; k < blocks; k++) {
                self.block_idx = {(unsigned)(k % g.x), (unsigned)(k / g.x % g.y),
                                  (unsigned)(k / g.x / g.y)};
                self.block_barrier = block_barrier.get();
                self.warp = &warp[t / 32];
                body(data);
                agentrl_emulation::flush_stores();  // a returning thread's stores land
                self.block_barrier->arrive_and_drop();
                self.warp->barrier->arrive_and_drop();
                between_blocks.arrive_and_wait();
                if (t == 0) fresh();
                between_blocks.arrive_and_wait();
            }
        });
    }
    for (auto &th : pool) th.join();
    return 0;
}

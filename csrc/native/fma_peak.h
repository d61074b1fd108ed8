// The FMA peak of the cores the native route runs on, measured: independent chains of fused multiply-adds on
// the widest vectors the hand-written kernels use here (AVX-512, AVX2/FMA, or the portable loop). The benchmark
// times it beside a large torch.mm, which on some CPUs runs at half this rate (a vendor BLAS taking its AVX2 path
// on an AVX-512 core), and would then overstate every row's "fraction of peak".
#pragma once
#include <cstdint>

namespace spconv {
namespace native {

// Runs `iters` steps of the chains on each of torch's intra-op threads and returns the FLOPs done (2 per
// multiply-add lane), so that the caller's clock gives the rate. fp64 selects double lanes.
int64_t fma_peak_loop(int64_t iters, bool fp64);

// The lanes one step of the loop multiplies and adds on one thread (FLOPs per step = 2 x this).
int64_t fma_peak_lanes_per_step(bool fp64);

}  // namespace native
}  // namespace spconv

// A worker thread's settings for the vendor GEMMs it calls: one thread per product, and the caller's
// below-autograd dispatch state.
#pragma once
#include <ATen/ATen.h>

// MKL's GEMM splits small-M products differently with 1 or 2 threads (different bits). Parallelism comes from
// the native route's fixed chunks only: each GEMM runs on one thread, so results don't depend on
// torch.set_num_threads. Weak, so builds whose BLAS isn't MKL simply skip it. (The lowercase
// mkl_set_num_threads_local symbol is MKL's Fortran entry point, which takes a pointer.)
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

namespace spconv {
namespace native {

struct OneThreadGemm {
  // ATen calls on OpenMP worker threads don't inherit the caller's below-autograd dispatch state: without
  // this, mm_out on tensors that require grad throws there (only with > 1 thread).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  int saved = 0;
  OneThreadGemm() {
    if (MKL_Set_Num_Threads_Local) saved = MKL_Set_Num_Threads_Local(1);
  }
  ~OneThreadGemm() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(saved);
  }
};

}  // namespace native
}  // namespace spconv

#include "output_cache.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#if defined(__unix__)
#include <pthread.h>
#endif

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace spconv {
namespace ops {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmallStep = size_t{64} << 10;  // blocks under 2 MB: 64 KB steps, no huge-page advice
constexpr int64_t kDefaultCapacityMb = 512;

struct Block {
  void* ptr;
  size_t bytes;
};

int64_t capacity_from_env() {
  const char* v = std::getenv("SPCONV_CPU_OUTPUT_CACHE_MB");
  if (v == nullptr || *v == '\0') return kDefaultCapacityMb << 20;
  char* end = nullptr;
  const long long mb = std::strtoll(v, &end, 10);
  TORCH_CHECK_VALUE(end != v && *end == '\0' && mb >= 0,
                    "SPCONV_CPU_OUTPUT_CACHE_MB must be a non-negative integer (megabytes), got '", v, "'");
  return static_cast<int64_t>(mb) << 20;
}

void free_block(Block* b) {
  std::free(b->ptr);
  delete b;
}

class OutputCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n < static_cast<size_t>(kMinCachedBytes)) return c10::GetDefaultCPUAllocator()->allocate(n);
    const size_t step = n < kHugePage ? kSmallStep : kHugePage;
    const size_t bytes = (n + step - 1) / step * step;
    Block* b = take(bytes);
    if (b == nullptr) b = fresh(bytes);
    return {b->ptr, b, &OutputCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  std::vector<int64_t> info() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {static_cast<int64_t>(cached_bytes_), static_cast<int64_t>(free_.size()), hits_, misses_, capacity()};
  }

  void clear() {
    std::vector<Block*> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gone.swap(free_);
      cached_bytes_ = 0;
    }
    for (Block* b : gone) free_block(b);
  }

 private:
  int64_t capacity() {  // read once, on first use (under the lock)
    if (capacity_ < 0) capacity_ = capacity_from_env();
    return capacity_;
  }

  // The smallest cached block of [bytes, bytes * 5/4]; ties go to the oldest. Reads the capacity (and raises
  // on a bad SPCONV_CPU_OUTPUT_CACHE_MB) before any block exists, so that releasing one never throws.
  Block* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity();
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const size_t s = free_[i]->bytes;
      if (s >= bytes && s <= bytes + bytes / 4 && (best == free_.size() || s < free_[best]->bytes)) best = i;
    }
    if (best == free_.size()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    Block* b = free_[best];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    cached_bytes_ -= b->bytes;
    return b;
  }

  static Block* fresh(size_t bytes) {
    const bool huge = bytes >= kHugePage;
    void* p = nullptr;
    if (posix_memalign(&p, huge ? kHugePage : 4096, bytes) != 0 || p == nullptr)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "spconv: out of CPU memory allocating ", bytes, " bytes");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint (ignored without transparent huge pages): 2 MB faults
#endif
    return new Block{p, bytes};
  }

  static void release(void* ctx);

  // Keeps b unless it alone exceeds the capacity; the oldest blocks make room.
  void keep(Block* b) {
    std::vector<Block*> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t cap = static_cast<size_t>(capacity());
      if (b->bytes > cap) {
        gone.push_back(b);
      } else {
        size_t drop = 0;
        while (cached_bytes_ + b->bytes > cap) cached_bytes_ -= free_[drop++]->bytes;
        gone.assign(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(drop));
        free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(drop));
        free_.push_back(b);
        cached_bytes_ += b->bytes;
      }
    }
    for (Block* g : gone) free_block(g);  // outside the lock: munmap can take a while
  }

  friend void after_fork_in_child();
  std::mutex mutex_;
  std::vector<Block*> free_;  // oldest first
  size_t cached_bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0, capacity_ = -1;
};

OutputCache* make_cache();

// Never destroyed: tensors may outlive static destruction at exit and still hand their blocks back.
OutputCache& cache() {
  static OutputCache* c = make_cache();
  return *c;
}

void OutputCache::release(void* ctx) { cache().keep(static_cast<Block*>(ctx)); }

// A fork while another thread held the lock (a DataLoader worker started from a process that runs ops on
// other threads) would leave the child's lock held forever: the child starts with a fresh one.
void after_fork_in_child() { new (&cache().mutex_) std::mutex(); }

OutputCache* make_cache() {
  OutputCache* c = new OutputCache();
#if defined(__unix__)
  pthread_atfork(nullptr, nullptr, &after_fork_in_child);
#endif
  return c;
}

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(options.dtype().itemsize());
  if (bytes < kMinCachedBytes || options.device().type() != c10::DeviceType::CPU) return at::empty(sizes, options);
  return at::detail::empty_generic(sizes, &cache(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   options.dtype().toScalarType(), std::nullopt);
}

// Below this many bytes an output is zeroed by the calling thread: at::zero_ would open a parallel region
// for anything over 128 KB, and on a busy machine each region can wait a time slice for a descheduled worker.
constexpr int64_t kSerialZeroBytes = int64_t{4} << 20;

at::Tensor zeros_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = empty_output(sizes, options);
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  if (bytes >= kSerialZeroBytes || t.device().type() != c10::DeviceType::CPU) return t.zero_();
  if (bytes > 0) std::memset(t.data_ptr(), 0, static_cast<size_t>(bytes));
  return t;
}

std::vector<int64_t> output_cache_info() { return cache().info(); }

void output_cache_clear() { cache().clear(); }

}  // namespace ops
}  // namespace spconv

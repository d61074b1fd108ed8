// A std::vector whose resize leaves new elements of trivial types uninitialised. The large buffers of the
// map passes are written whole by parallel passes: a value-initialising resize would add a serial pass over
// their memory (taking all its page faults on one thread) before the parallel one.
#pragma once
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace spconv {
namespace native {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;  // default-initialisation: nothing for trivial types
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace native
}  // namespace spconv

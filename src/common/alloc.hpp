// common/alloc.hpp — an allocator for large arrays written once right after they are sized (internal).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include <sys/mman.h>

namespace spattn::common {

// A std::allocator that leaves new elements of trivial types uninitialised (resize() writes nothing).
// Blocks of 2 MiB or more are 2 MiB aligned and advised for transparent huge pages (Linux): a random plan's
// residue keys (src/cpu) and a GPU plan's bitmasks (plan/gpu/block_plan.hpp) are written once, and 4 KiB pages made a page
// fault per thousand keys.
template <class T>
struct HugeUninitAllocator : std::allocator<T> {
  static constexpr size_t kHuge = size_t(2) << 20, kHugeFrom = size_t(2) << 20;
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugeFrom) return std::allocator<T>::allocate(n);
    void* mem = nullptr;
    if (posix_memalign(&mem, kHuge, (bytes + kHuge - 1) / kHuge * kHuge) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(mem, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(mem);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugeFrom) std::allocator<T>::deallocate(p, n);
    else std::free(p);
  }
  template <class U>
  struct rebind {
    using other = HugeUninitAllocator<U>;
  };
  HugeUninitAllocator() = default;
  template <class U>
  HugeUninitAllocator(const HugeUninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};

}  // namespace spattn::common

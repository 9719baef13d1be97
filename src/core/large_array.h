// Arrays of hundreds of MB that kernels stream (the CPU KV cache): 2 MB aligned and marked for
// transparent huge pages (madvise, where the kernel's THP mode is "madvise", the common default),
// so that a pass over them takes a TLB entry per 2 MB instead of per 4 KB. Like new[], the memory
// is left uninitialised and is backed only where it is touched.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace kestrel {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using LargeArray = std::unique_ptr<T[], FreeDeleter>;

// n elements, or null when the memory is not there.
template <class T>
LargeArray<T> AllocateLargeArray(size_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (n * sizeof(T) + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes == 0 ? kHuge : bytes);
  if (p == nullptr) return nullptr;
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KB
  return LargeArray<T>(static_cast<T*>(p));
}

}  // namespace kestrel

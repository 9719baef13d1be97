#include "backends/cuda/pdl.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kestrel::cuda {
namespace {

// -1 until first read.
std::atomic<int> g_pdl{-1};

}  // namespace

bool PdlEnabled() {
  int v = g_pdl.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  const char* env = std::getenv("KESTREL_PDL");
  const int from_env = env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
  int expected = -1;
  g_pdl.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
  return g_pdl.load(std::memory_order_relaxed) != 0;
}

void SetPdlEnabled(bool on) {
  g_pdl.store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace kestrel::cuda

#include "backends/cuda/pdl.cuh"

#include <cstring>

#include "backends/cuda/env_setting.h"

namespace kestrel::cuda {
namespace {

// On unless KESTREL_PDL is "0".
EnvSetting g_pdl{"KESTREL_PDL", [](const char* env) {
  return env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
}};

}  // namespace

bool PdlEnabled() {
  return g_pdl.Get() != 0;
}

void SetPdlEnabled(bool on) {
  g_pdl.Set(on ? 1 : 0);
}

}  // namespace kestrel::cuda

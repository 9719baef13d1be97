// Model::Load: config.json + safetensors -> the forward implementation of the architecture.
#include "models/model.h"

#include "models/cpu_runner.h"
#include "models/safetensors.h"
#ifdef KESTREL_HAS_CUDA
#include "backends/cuda/device.h"
#include "models/cuda_runner.h"
#endif

namespace kestrel {

const char* DeviceName(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Status CudaDeviceStatus(int ordinal) {
#ifdef KESTREL_HAS_CUDA
  return cuda::OpenDevice(ordinal).status();
#else
  (void)ordinal;
  return Unsupported("this build of Kestrel has no CUDA backend (configure with -DKESTREL_CUDA=ON "
                     "where nvcc is installed); use --device cpu");
#endif
}

bool CudaDeviceAvailable() {
#ifdef KESTREL_HAS_CUDA
  return cuda::CudaAvailable();
#else
  return false;
#endif
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& model_dir,
                                           const ModelLoadOptions& options) {
  KASSIGN(ModelConfig config, LoadModelConfig(model_dir));
  KASSIGN(WeightStore store, WeightStore::Open(model_dir));
  if (options.device == Device::kCuda) {
#ifdef KESTREL_HAS_CUDA
    return LoadCudaModel(std::move(config), std::move(store), options);
#else
    return Unsupported("this build of Kestrel has no CUDA backend (configure with "
                       "-DKESTREL_CUDA=ON where nvcc is installed); use --device cpu");
#endif
  }
  return LoadCpuModel(std::move(config), std::move(store), options);
}

}  // namespace kestrel

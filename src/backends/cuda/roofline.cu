#include "backends/cuda/roofline.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/linear.h"

namespace kestrel::cuda {
namespace {

// Fills with a cheap hash-based pseudo-random bf16 in [-1, 1): timing on zeros is optimistic
// (METHOD.md), so the GEMM ceiling is measured on random values.
__global__ void FillRandomBf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn(static_cast<float>(h & 0xFFFFu) / 32768.0f - 1.0f);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<Roofline> MeasureRoofline(int64_t copy_bytes, int64_t gemm_size, int repeats) {
  Roofline r;
  r.copy_bytes = copy_bytes;
  r.gemm_size = gemm_size;
  cudaStream_t stream;
  KCUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  KCUDA_CHECK(cudaEventCreate(&e0));
  KCUDA_CHECK(cudaEventCreate(&e1));
  {
    KASSIGN(DeviceBuffer src, DeviceBuffer::Allocate(copy_bytes, "the bandwidth probe"));
    KASSIGN(DeviceBuffer dst, DeviceBuffer::Allocate(copy_bytes, "the bandwidth probe"));
    FillRandomBf16<<<1024, 256, 0, stream>>>(src.as<__nv_bfloat16>(), copy_bytes / 2, 1);
    KCUDA_CHECK_LAUNCH();
    std::vector<double> rates;
    for (int i = 0; i < repeats + 2; ++i) {
      KCUDA_CHECK(cudaEventRecord(e0, stream));
      KCUDA_CHECK(
          cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
      KCUDA_CHECK(cudaEventRecord(e1, stream));
      KCUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      KCUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2) rates.push_back(2.0 * static_cast<double>(copy_bytes) / (ms * 1e-3) / 1e9);
    }
    r.copy_gb_per_s = Median(rates);
  }
  {
    const int64_t n = gemm_size;
    KASSIGN(DeviceBuffer a, DeviceBuffer::Allocate(n * n * 2, "the GEMM probe"));
    KASSIGN(DeviceBuffer b, DeviceBuffer::Allocate(n * n * 2, "the GEMM probe"));
    KASSIGN(DeviceBuffer c, DeviceBuffer::Allocate(n * n * 4, "the GEMM probe"));
    FillRandomBf16<<<1024, 256, 0, stream>>>(a.as<__nv_bfloat16>(), n * n, 2);
    KCUDA_CHECK_LAUNCH();
    FillRandomBf16<<<1024, 256, 0, stream>>>(b.as<__nv_bfloat16>(), n * n, 3);
    KCUDA_CHECK_LAUNCH();
    KASSIGN(std::unique_ptr<LinearEngine> lin, LinearEngine::Create());
    std::vector<double> rates;
    for (int i = 0; i < repeats + 2; ++i) {
      KCUDA_CHECK(cudaEventRecord(e0, stream));
      lin->RunCublasLt(a.as<__nv_bfloat16>(), n, n, b.as<__nv_bfloat16>(), n, c.as<float>(),
                       stream);
      KCUDA_CHECK(cudaEventRecord(e1, stream));
      KCUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      KCUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2) {
        rates.push_back(2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12);
      }
    }
    r.gemm_tflop_per_s = Median(rates);
  }
  KCUDA_CHECK(cudaEventDestroy(e0));
  KCUDA_CHECK(cudaEventDestroy(e1));
  KCUDA_CHECK(cudaStreamDestroy(stream));
  return r;
}

}  // namespace kestrel::cuda

#include "backends/cuda/device.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"

namespace kestrel::cuda {

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  }
  return buf;
}

bool CudaAvailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return n > 0;
}

Result<DeviceInfo> OpenDevice(int ordinal) {
  DeviceInfo info;
  info.ordinal = ordinal;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  int n = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&n);
  if (count_err != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (info.driver_version == 0) {
      return Unavailable(
          "no NVIDIA driver found (is the GPU visible to this machine?); use "
          "--device cpu");
    }
    if (info.driver_version < info.runtime_version) {
      return Unavailable(
          "the NVIDIA driver supports CUDA " + std::to_string(info.driver_version / 1000) + "." +
          std::to_string(info.driver_version % 1000 / 10) + " but this build needs CUDA " +
          std::to_string(info.runtime_version / 1000) + "." +
          std::to_string(info.runtime_version % 1000 / 10) +
          ": update the driver or use --device cpu");
    }
    return count_err != cudaSuccess ? CudaStatus(count_err, "no usable CUDA device")
                                    : Unavailable("no CUDA device found; use --device cpu");
  }
  if (ordinal < 0 || ordinal >= n) {
    return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                           std::to_string(n) + " visible)");
  }
  if (cudaError_t err = cudaSetDevice(ordinal); err != cudaSuccess) {
    return CudaStatus(err, "cannot use CUDA device " + std::to_string(ordinal));
  }
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, ordinal); err != cudaSuccess) {
    return CudaStatus(err, "cannot read the properties of CUDA device " + std::to_string(ordinal));
  }
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.n_sms = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.max_smem_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  size_t free_b = 0, total_b = 0;
  if (cudaError_t err = cudaMemGetInfo(&free_b, &total_b); err != cudaSuccess) {
    return CudaStatus(err, "cannot query the memory of CUDA device " + std::to_string(ordinal));
  }
  info.free_bytes = static_cast<int64_t>(free_b);
  info.total_bytes = static_cast<int64_t>(total_b);
  if (info.cc_major < 9) {
    return Unsupported(info.name + " has compute capability " + std::to_string(info.cc_major) +
                       "." + std::to_string(info.cc_minor) +
                       "; this build of Kestrel targets sm_90 (Hopper): rebuild with "
                       "-DCMAKE_CUDA_ARCHITECTURES=<yours> or use --device cpu");
  }
  return info;
}

int CurrentDeviceSmCount() {
  static const int sms = [] {
    int device = 0, v = 0;
    KCUDA_CHECK(cudaGetDevice(&device));
    KCUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    return v;
  }();
  return sms;
}

std::string DescribeDevice(const DeviceInfo& info) {
  return info.name + ", sm_" + std::to_string(info.cc_major) + std::to_string(info.cc_minor) +
         ", " + std::to_string(info.n_sms) + " SMs, " + FormatBytes(info.total_bytes) + " (" +
         FormatBytes(info.free_bytes) + " free)";
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, std::string_view what) {
  DeviceBuffer buf;
  if (bytes == 0) return buf;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return ResourceExhausted("not enough GPU memory for " + std::string(what) + ": needs " +
                             FormatBytes(static_cast<int64_t>(bytes)) + ", " +
                             FormatBytes(static_cast<int64_t>(free_b)) + " free of " +
                             FormatBytes(static_cast<int64_t>(total_b)) + " (" +
                             cudaGetErrorString(err) + ")");
  }
  buf.ptr_ = p;
  buf.bytes_ = bytes;
  return buf;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) KCUDA_CHECK(cudaFree(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
}

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes, std::string_view what) {
  PinnedBuffer buf;
  if (bytes == 0) return buf;
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, "cannot allocate " + FormatBytes(static_cast<int64_t>(bytes)) +
                               " of pinned host memory for " + std::string(what));
  }
  buf.ptr_ = p;
  buf.bytes_ = bytes;
  return buf;
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) KCUDA_CHECK(cudaFreeHost(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace kestrel::cuda

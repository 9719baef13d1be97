// The CUDA device: discovery, properties, and the checks that turn "no GPU" or "driver too old"
// into one readable message.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kestrel::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int n_sms = 0;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int64_t l2_bytes = 0;
  int64_t max_smem_per_block_optin = 0;
  int driver_version = 0;   // e.g. 13000
  int runtime_version = 0;  // e.g. 13000
};

// True when at least one CUDA device is usable (driver loaded, device visible). Never aborts.
bool CudaAvailable();

// Selects device `ordinal` on the calling thread and returns its properties. Errors (no device,
// driver older than the runtime, compute capability below what this build targets) are
// kUnavailable / kUnsupported with a message that says what to do.
Result<DeviceInfo> OpenDevice(int ordinal = 0);

// The SM count of the calling thread's current device, read once per process (kernels size their
// grids by it; a process uses one device).
int CurrentDeviceSmCount();

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB (137.2 GiB free)"
std::string DescribeDevice(const DeviceInfo& info);

// "1.50 GiB" / "512.0 MiB"
std::string FormatBytes(int64_t bytes);

}  // namespace kestrel::cuda

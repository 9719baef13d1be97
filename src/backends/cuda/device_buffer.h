// Move-only owner of one device allocation (STYLE.md rule 8). Ops take raw pointers / views into
// it; copies are explicit (CopyFromHost / CopyToHost).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "core/status.h"

namespace kestrel::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // cudaMalloc of `bytes` (256-byte aligned). `what` names the buffer in the out-of-memory
  // message, which also gives the bytes asked for and the bytes free.
  static Result<DeviceBuffer> Allocate(size_t bytes, std::string_view what);

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size_bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned (page-locked) host memory, for uploads and downloads that overlap with kernels.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  static Result<PinnedBuffer> Allocate(size_t bytes, std::string_view what);

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size_bytes() const { return bytes_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kestrel::cuda

// The scope of every CUDA call a ring makes (event records and queries, waits, pinning and freeing).
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

namespace pinstage {

// The ring's device is current, whichever device the caller has (stats() and configure() arrive
// without a guard; events and pinned memory belong to the device current when made). Relaxed
// capture mode: a graph captured meanwhile by another thread in torch's default "global" mode
// neither refuses these calls nor is invalidated by them, as PyTorch's caching allocators arrange.
struct RingCudaScope {
  explicit RingCudaScope(c10::DeviceIndex device) : device_guard(device) {}
  c10::cuda::CUDAGuard device_guard;
  c10::cuda::CUDAStreamCaptureModeGuard capture_mode{cudaStreamCaptureModeRelaxed};
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA

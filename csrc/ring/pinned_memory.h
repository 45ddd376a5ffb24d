// Page-locked host memory for the rings and their overflow blocks.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ring/cuda_scope.h"

namespace pinstage {

// `bytes` of portable pinned host memory (the copy engine of any device may read it, whichever
// device is current later). torch.OutOfMemoryError when the host cannot pin that much; the failed
// call's error is cleared so that it does not surface in an unrelated later CUDA check.
inline uint8_t* allocate_pinned(size_t bytes, c10::DeviceIndex device) {
  const RingCudaScope scope(device);
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "pinstage: could not pin ", bytes,
                     " bytes of host memory for cuda:", static_cast<int>(device), ": ", cudaGetErrorString(err));
  }
  return static_cast<uint8_t*>(p);
}

// cudaMemcpyAsync, with the one refusal engines meet explained: while another thread captures a CUDA
// graph in torch's default "global" mode, the driver refuses copies in every thread.
inline void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  if (err == cudaErrorStreamCaptureUnsupported || err == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();
    TORCH_CHECK(false,
                "pinstage: the CUDA driver refused the copy because another thread is capturing a CUDA graph "
                "in torch's default \"global\" capture mode, which forbids it (and torch's own copies) in every "
                "thread; capture with torch.cuda.graph(..., capture_error_mode=\"thread_local\") to stage meanwhile");
  }
  C10_CUDA_CHECK(err);
}

// Waits until `device` is idle, before freeing pinned memory. cudaFreeHost waits for the whole
// device and, while it waits, the driver blocks every other thread's cudaMemcpyAsync (a staging
// stalled 1.2 s behind a 1.5 s kernel on an H200), whereas cudaDeviceSynchronize blocks only its
// caller: drained first, cudaFreeHost then waits only for work enqueued in between. A device-wide
// wait is invalid while a stream of the device captures a CUDA graph: the caller then frees nothing.
inline void drain_device(c10::DeviceIndex device) {
  const RingCudaScope scope(device);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, "pinstage: could not wait for cuda:", static_cast<int>(device),
                " before freeing pinned memory (", cudaGetErrorString(err),
                "); nothing was freed. A CUDA graph captured meanwhile by another thread is the usual cause: "
                "call empty_cache() or configure(ring_bytes=...) after the capture");
  }
}

// Frees pinned blocks once drain_device() returned; only configure() and empty_cache() call this.
inline void free_pinned(const std::vector<uint8_t*>& blocks, c10::DeviceIndex device) {
  const RingCudaScope scope(device);
  for (uint8_t* p : blocks) C10_CUDA_CHECK(cudaFreeHost(p));
}

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA

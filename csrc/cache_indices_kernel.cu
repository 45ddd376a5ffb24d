// The CUDA half of write_cache_indices: one block per request, its threads striding over the row.
#include "cache_indices.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace pinstage {
namespace {

constexpr int kThreadsPerRequest = 256;

__global__ void write_cache_indices_kernel(
    int32_t* __restrict__ req_to_token,
    int64_t row_stride,
    int64_t rows,
    int64_t max_context_len,
    const int64_t* __restrict__ req_pool_indices,
    const uint64_t* __restrict__ prefix_pointers,
    const int64_t* __restrict__ prefix_lens,
    const int64_t* __restrict__ seq_lens,
    const int64_t* __restrict__ out_cache_offsets,
    const int64_t* __restrict__ out_cache_loc,
    int64_t out_cache_len) {
  const int64_t req = blockIdx.x;
  const int64_t row = req_pool_indices[req];
  const int64_t prefix_len = prefix_lens[req];
  const int64_t seq_len = seq_lens[req];
  const int64_t offset = out_cache_offsets[req];
  // The host validated these before staging them; this guard only keeps a call that bypassed the
  // builder from writing outside req_to_token or reading outside out_cache_loc.
  // Written as subtractions, which cannot overflow once 0 <= prefix_len <= seq_len holds.
  if (row < 0 || row >= rows || prefix_len < 0 || seq_len < prefix_len || seq_len > max_context_len ||
      offset < 0 || offset > out_cache_len || seq_len - prefix_len > out_cache_len - offset) {
    return;
  }
  int32_t* dst = req_to_token + row * row_stride;
  const int64_t* prefix = reinterpret_cast<const int64_t*>(prefix_pointers[req]);
  for (int64_t pos = threadIdx.x; pos < seq_len; pos += blockDim.x) {
    // KV slot indices fit in int32 by the pool's construction (req_to_token is int32 upstream too).
    dst[pos] = static_cast<int32_t>(pos < prefix_len ? prefix[pos] : out_cache_loc[offset + pos - prefix_len]);
  }
}

}  // namespace

void write_cache_indices_cuda(
    const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_pointers,
    const at::Tensor& prefix_lens,
    const at::Tensor& seq_lens,
    const at::Tensor& out_cache_offsets,
    const at::Tensor& out_cache_loc,
    std::optional<c10::Stream> stream) {
  const int64_t batch = req_pool_indices.numel();
  if (batch == 0) {
    return;
  }
  const c10::cuda::CUDAGuard device_guard(req_to_token.device());
  const c10::cuda::CUDAStream cuda_stream = stream.has_value()
      ? c10::cuda::CUDAStream(*stream)
      : c10::cuda::getCurrentCUDAStream(req_to_token.device().index());
  write_cache_indices_kernel<<<static_cast<unsigned int>(batch), kThreadsPerRequest, 0, cuda_stream.stream()>>>(
      req_to_token.data_ptr<int32_t>(),
      req_to_token.stride(0),
      req_to_token.size(0),
      req_to_token.size(1),
      req_pool_indices.const_data_ptr<int64_t>(),
      static_cast<const uint64_t*>(prefix_pointers.const_data_ptr()),
      prefix_lens.const_data_ptr<int64_t>(),
      seq_lens.const_data_ptr<int64_t>(),
      out_cache_offsets.const_data_ptr<int64_t>(),
      out_cache_loc.const_data_ptr<int64_t>(),
      out_cache_loc.numel());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pinstage

// The CUDA half of write_cache_indices: one block per request, its threads striding over the row.
#include <cuda_runtime_api.h>

#include "ops/write_cache_indices.h"

namespace pinstage {
namespace {

constexpr int kThreadsPerRequest = 256;

__global__ void write_cache_indices_kernel(const CacheIndexParams p) {
  const int64_t req = blockIdx.x;
  const int64_t row = p.req_pool_indices[req];
  const int64_t prefix_len = p.prefix_lens[req];
  const int64_t seq_len = p.seq_lens[req];
  const int64_t offset = p.out_cache_offsets[req];
  // The host validated these before staging them; this guard only keeps a call that bypassed that
  // from writing outside req_to_token or reading outside out_cache_loc. Bounds are subtractions,
  // which cannot overflow once 0 <= prefix_len <= seq_len holds.
  if (row < 0 || row >= p.rows || prefix_len < 0 || seq_len < prefix_len || seq_len > p.max_context_len ||
      prefix_len > p.prefix_numels[req] || offset < 0 || offset > p.out_cache_len ||
      seq_len - prefix_len > p.out_cache_len - offset) {
    return;
  }
  int32_t* dst = p.req_to_token + row * p.row_stride;
  const int64_t* prefix = reinterpret_cast<const int64_t*>(p.prefix_pointers[req]);
  for (int64_t pos = threadIdx.x; pos < seq_len; pos += blockDim.x) {
    // KV slot indices fit in int32 by the pool's construction (req_to_token is int32 upstream too).
    dst[pos] = static_cast<int32_t>(pos < prefix_len ? prefix[pos] : p.out_cache_loc[offset + pos - prefix_len]);
  }
}

}  // namespace

int launch_write_cache_indices(const CacheIndexParams& p, void* stream) {
  if (p.batch == 0) return static_cast<int>(cudaSuccess);
  write_cache_indices_kernel<<<static_cast<unsigned int>(p.batch), kThreadsPerRequest, 0,
                               static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace pinstage

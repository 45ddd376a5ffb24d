// The CUDA half of write_cache_indices: one block per request, its threads striding over the row;
// blocks past the batch copy a staging's bytes (stage_prefill: its copy and its cache rows in one
// launch), or for a large staging the copy engine does, first.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "ops/write_cache_indices.h"

namespace pinstage {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxCopyBlocks = 1024;  // each copy thread strides on past this many blocks' worth

__device__ void write_row(const CacheIndexParams& p, int64_t req) {
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

// 16 bytes per load where both ends are 16-byte aligned (the ring's regions and the caching
// allocator's blocks are), the remaining bytes one by one.
__device__ void copy_part(const StagedCopy& c, int64_t thread, int64_t threads) {
  const bool aligned = ((reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst)) & 15) == 0;
  const int64_t vectors = aligned ? c.bytes / 16 : 0;
  const auto* src = static_cast<const uint4*>(c.src);
  auto* dst = static_cast<uint4*>(c.dst);
  for (int64_t i = thread; i < vectors; i += threads) dst[i] = src[i];
  for (int64_t i = vectors * 16 + thread; i < c.bytes; i += threads) {
    static_cast<uint8_t*>(c.dst)[i] = static_cast<const uint8_t*>(c.src)[i];
  }
}

__global__ void write_cache_indices_kernel(const CacheIndexParams p, const StagedCopy copy) {
  if (blockIdx.x < p.batch) {
    write_row(p, blockIdx.x);
    return;
  }
  const int64_t copy_blocks = gridDim.x - p.batch;
  copy_part(copy, (blockIdx.x - p.batch) * blockDim.x + threadIdx.x, copy_blocks * blockDim.x);
}

}  // namespace

int launch_write_cache_indices(const CacheIndexParams& params, const StagedCopy& copy, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  CacheIndexParams p = params;
  StagedCopy by_blocks = copy;
  if (copy.bytes > kBlocksCopyMaxBytes) {
    const cudaError_t copied =
        cudaMemcpyAsync(copy.dst, copy.src, static_cast<size_t>(copy.bytes), cudaMemcpyHostToDevice, s);
    if (copied != cudaSuccess) return static_cast<int>(copied);
    // out_cache_loc staged with the copy: the rows read the device's copy of it, behind the copy.
    const auto src = reinterpret_cast<uintptr_t>(copy.src);
    const auto loc = reinterpret_cast<uintptr_t>(p.out_cache_loc);
    if (loc >= src && loc - src < static_cast<uintptr_t>(copy.bytes)) {
      p.out_cache_loc = reinterpret_cast<const int64_t*>(static_cast<uint8_t*>(copy.dst) + (loc - src));
    }
    by_blocks = StagedCopy{};
  }
  const int64_t per_block = int64_t{kThreadsPerBlock} * 16;
  const int64_t copy_blocks = std::min(kMaxCopyBlocks, (by_blocks.bytes + per_block - 1) / per_block);
  const int64_t blocks = p.batch + copy_blocks;
  if (blocks == 0) return static_cast<int>(cudaSuccess);
  write_cache_indices_kernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0, s>>>(p, by_blocks);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace pinstage

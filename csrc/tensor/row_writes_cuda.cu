// The CUDA half of StaticInputs' row writes: one block per group of writes, its threads striding
// over each write with the widest load its addresses and length allow.
#include <cuda_runtime_api.h>

#include "tensor/row_writes.h"

namespace pinstage {
namespace {

constexpr int kThreads = 128;

template <class Unit>
__device__ void copy_units(uint8_t* dst, const uint8_t* src, uint64_t nbytes) {
  Unit* d = reinterpret_cast<Unit*>(dst);
  const Unit* s = reinterpret_cast<const Unit*>(src);
  for (uint64_t i = threadIdx.x; i < nbytes / sizeof(Unit); i += blockDim.x) d[i] = s[i];
}

__device__ void copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t nbytes) {
  const uint64_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | nbytes;
  if (align % 16 == 0) {
    copy_units<uint4>(dst, src, nbytes);
  } else if (align % 8 == 0) {
    copy_units<uint2>(dst, src, nbytes);
  } else if (align % 4 == 0) {
    copy_units<uint32_t>(dst, src, nbytes);
  } else if (align % 2 == 0) {
    copy_units<uint16_t>(dst, src, nbytes);
  } else {
    copy_units<uint8_t>(dst, src, nbytes);
  }
}

__global__ void row_writes_kernel(const RowWriteParams p) {
  if (p.records != nullptr) {
    constexpr unsigned kLoads = kRecordBytes / sizeof(uint4);
    __shared__ uint4 record[kLoads];
    if (threadIdx.x < kLoads) record[threadIdx.x] = reinterpret_cast<const uint4*>(p.records + blockIdx.x)[threadIdx.x];
    __syncthreads();
    const auto* r = reinterpret_cast<const RowWriteRecord*>(record);
    copy_bytes(p.allocation + r->dst, r->values, r->nbytes);
    return;
  }
  const uint32_t group = blockIdx.x;
  const uint32_t first = p.group_starts != nullptr ? p.group_starts[group] : group;
  const uint32_t end = p.group_starts != nullptr ? p.group_starts[group + 1] : group + 1;
  for (uint32_t w = first; w < end; ++w) {
    const RowWriteOp op = p.ops[w];
    copy_bytes(p.allocation + op.dst, p.contents + op.src, op.nbytes);
    // A later write of the group may overlap this one: it lands after it (end is the same for
    // every thread of the block, so all of them reach the barrier).
    if (w + 1 < end) __syncthreads();
  }
}

}  // namespace

int launch_row_writes(const RowWriteParams& p, void* stream) {
  if (p.groups == 0) return static_cast<int>(cudaSuccess);
  row_writes_kernel<<<p.groups, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace pinstage

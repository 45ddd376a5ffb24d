// Row writes of StaticInputs' persistent fields, as the device applies them: one kernel for every
// write of a stage, reading the packed writes from the stage's pinned ring region (mapped: the GPU
// reads host memory in place), so the step's copy stays one and the region is sealed behind it.
#pragma once

#include <cstdint>

namespace pinstage {

// One write: nbytes from contents + src to the allocation at dst.
struct RowWriteOp {
  uint64_t dst;
  uint64_t src;
  uint64_t nbytes;
};

// Writes that may overlap (the same row of the same field) form one group, applied in order by one
// block; groups touch disjoint bytes. group_starts is null when every group is one write.
struct RowWriteParams {
  uint8_t* allocation;
  const RowWriteOp* ops;
  const uint32_t* group_starts;  // [groups + 1]
  const uint8_t* contents;
  uint32_t groups;
};

#ifdef PINSTAGE_WITH_CUDA
// Enqueues the kernel on `stream` (a cudaStream_t); returns the launch's cudaError_t as an int so
// that the caller seals the ring region before it throws.
int launch_row_writes(const RowWriteParams& p, void* stream);
#endif

}  // namespace pinstage

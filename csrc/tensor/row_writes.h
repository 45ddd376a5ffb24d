// Row writes of StaticInputs' persistent fields, as the device applies them: one kernel for every
// write of a stage, reading the packed writes from the stage's pinned ring region (mapped: the GPU
// reads host memory in place), so the step's copy stays one and the region is sealed behind it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pinstage {

// One write: nbytes from contents + src to the allocation at dst.
struct RowWriteOp {
  uint64_t dst;
  uint64_t src;
  uint64_t nbytes;
};

// A short write and its values in one 128-byte record: a block reads it with one load per thread,
// one trip over the bus instead of two (the op, then its values). A block table's step is of these.
constexpr size_t kRecordBytes = 128;
constexpr size_t kRecordValues = kRecordBytes - 16;
struct alignas(16) RowWriteRecord {
  uint64_t dst;
  uint64_t nbytes;
  uint8_t values[kRecordValues];
};
static_assert(sizeof(RowWriteRecord) == kRecordBytes, "a record is 128 bytes");

// Either records (one write per block, in no particular order: they touch disjoint bytes), or ops:
// writes that may overlap (the same row of the same field) form one group, applied in order by one
// block; groups touch disjoint bytes; group_starts is null when every group is one write.
struct RowWriteParams {
  uint8_t* allocation;
  const RowWriteRecord* records;
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

// write_cache_indices: fill request-to-token rows with KV slot indices, for a whole batch at once.
//
// Row req_pool_indices[i] of req_to_token (int32 [rows, max_context_len]) receives request i's cached
// prefix (the int64 tensor prefix_tensors[i]) at [0, prefix_lens[i]) and its slice
// out_cache_loc[out_cache_offsets[i] : out_cache_offsets[i] + seq_lens[i] - prefix_lens[i]] at
// [prefix_lens[i], seq_lens[i]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace pinstage {

// What the kernel and the CPU loop read: filled from tensors whose dtypes, shapes, devices and memory
// have been checked. The prefix addresses are taken by the op from the prefix tensors themselves,
// never from its caller.
struct CacheIndexParams {
  int32_t* req_to_token;
  int64_t row_stride;
  int64_t rows;
  int64_t max_context_len;
  int64_t batch;
  const int64_t* req_pool_indices;
  const uint64_t* prefix_pointers;  // prefix_tensors[i]'s data
  const int64_t* prefix_numels;     // and its length: a longer prefix_lens[i] is out of bounds
  const int64_t* prefix_lens;
  const int64_t* seq_lens;
  const int64_t* out_cache_offsets;
  const int64_t* out_cache_loc;
  int64_t out_cache_len;
};

// The most bytes the kernel's blocks copy themselves (256 KB). SMs reading mapped memory over PCIe take
// less device time than a cudaMemcpyAsync and a second launch up to a few hundred kilobytes and more
// above (bench/prefill_copy.py; docs/design.md, Measuring in a loop): above it the copy engine copies.
inline constexpr int64_t kBlocksCopyMaxBytes = int64_t{256} << 10;

// Bytes copied with the rows (stage_prefill's staging: from its ring region, mapped pinned memory, to
// the items' device memory): by the kernel's own blocks, or above kBlocksCopyMaxBytes by the copy
// engine first. None by default.
struct StagedCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};

// One value per request, in memory of the op's own (read once from the caller's columns, so that another
// thread cannot change a value between its check and its use). offsets: empty, or out_cache_offsets;
// extend_lens: empty, or one per request (checked against seq_lens - prefix_lens).
struct RequestValues {
  std::vector<int64_t> rows, prefix_lens, seq_lens, offsets, extend_lens;
};

// The prefix tensors, borrowed: the op's own list, or the tensors of Python objects the binding
// holds. A copy of an at::Tensor that only its PyObject owned makes torch take a reference to that
// object, and drop it later: two trips through the interpreter per request.
using PrefixRefs = c10::ArrayRef<const at::Tensor*>;

// What torch.ops.pinstage.write_cache_indices runs (library.cpp has its schema; its kernels pass
// their TensorList here), also called directly by pinstage.builders.write_cache_indices
// (bindings/module.cpp): the same checks and kernel without torch's dispatcher. Sets its own device
// guard and uses the current stream.
void write_cache_indices(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, PrefixRefs prefix_tensors,
                         const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                         const std::optional<at::Tensor>& out_cache_offsets, const at::Tensor& out_cache_loc,
                         const std::optional<at::Tensor>& extend_lens);

// The prefix tensors' addresses and lengths, taken from the tensors (checked, never read).
struct PrefixTable {
  std::vector<uint64_t> pointers;
  std::vector<int64_t> numels;
};

// A write of columns given as lists (converted into `values`, no offsets) in two steps, for a
// caller that makes out_cache_loc after the checks (stage_prefill stages it): the constructor checks
// every request against req_to_token, the prefixes and out_cache_loc's length; run() checks
// out_cache_loc itself and that req_to_token and the prefixes still are what was checked (Python
// code may run in between: a fallback conversion, another thread while the ring waits), then runs
// the loop or launches the kernel on the current stream. req_to_token, the prefixes and their list
// are borrowed: the caller keeps them alive until run() returns.
class ListCacheWrite {
 public:
  // out_cache_loc: where it exists already, checked here too (else by run() alone).
  ListCacheWrite(const at::Tensor& req_to_token, PrefixRefs prefix_tensors, int64_t out_cache_len, RequestValues values,
                 const at::Tensor* out_cache_loc = nullptr);
  ListCacheWrite(const ListCacheWrite&) = delete;  // params_ points into values_
  ListCacheWrite& operator=(const ListCacheWrite&) = delete;
  void run(const at::Tensor& out_cache_loc);
#ifdef PINSTAGE_WITH_CUDA
  // stage_prefill's write on a device, made by the launch that copies its staging (in place of
  // run()): ring_bytes() more of the staging's ring region for the kernel's per-request arrays; then
  // launch_with_copy() writes them at `columns`, checks again that req_to_token and the prefixes are
  // what was checked, and launches the kernel on `stream`, reading out_cache_loc in the ring (or its device copy).
  // Returns the launch's cudaError_t; throws only before launching.
  size_t ring_bytes() const;
  int launch_with_copy(const int64_t* out_cache_loc, const StagedCopy& copy, uint8_t* columns, void* stream);
#endif

 private:
  void check_unchanged() const;  // req_to_token and the prefixes are still what was checked

  const at::Tensor& req_to_token_;
  PrefixRefs prefix_tensors_;  // the caller's list, checked again by run()
  RequestValues values_;
  CacheIndexParams params_{};
  PrefixTable table_;
};

// pinstage.builders.write_cache_indices's entry for columns given as lists (bindings/module.cpp
// converts them into `values`, no offsets): the op's checks and kernel, without per-request tensors.
void write_cache_indices_of_lists(const at::Tensor& req_to_token, PrefixRefs prefix_tensors,
                                  const at::Tensor& out_cache_loc, RequestValues values);

#ifdef PINSTAGE_WITH_CUDA
// One block per request on `stream` (a cudaStream_t), rows whose values are out of bounds skipped,
// and blocks that copy `copy`; a larger copy than kBlocksCopyMaxBytes is a cudaMemcpyAsync before the
// launch instead, and an out_cache_loc inside it is read from its device copy. Returns the first failed call's
// cudaError_t: the caller seals the ring region they read before checking it.
int launch_write_cache_indices(const CacheIndexParams& p, const StagedCopy& copy, void* stream);
#endif

}  // namespace pinstage

// stage_prefill: a prefill's inputs in one call. The caller's items (prompt lists, sampling values),
// and the logits processor's four index arrays computed from the extend lengths and logprob starts,
// in one ring region and one copy; where asked, req_to_token's rows written from one of the items
// (out_cache_loc) too, on the same stream: on a device the cache-index kernel is the copy (one launch
// copies the items and writes the rows, reading the prefixes on the device and the rest in the ring).
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/write_cache_indices.h"

namespace pinstage {

// req_to_token and the prefixes are borrowed from the caller's Python objects, which it holds for
// the call.
struct PrefillCacheRows {
  const at::Tensor* req_to_token;
  std::vector<const at::Tensor*> prefix_tensors;
  RequestValues values;        // rows, prefix_lens, seq_lens; extend_lens are the call's own
  int64_t out_cache_loc_item;  // the item that is out_cache_loc (int64, one per new token)
};

// Returns a tensor per item, then sample_indices, input_logprob_indices, pruned_lens and
// pruned_row_indices. Every check of the arguments (the items, the lengths, the cache rows) comes
// before anything is staged or written; once the items are written only the check that
// req_to_token and the prefixes did not change meanwhile can fail, and then nothing is staged or
// written (on the CPU: nothing is written).
std::vector<at::Tensor> stage_prefill(PyObject* items, std::vector<int64_t> extend_lens,
                                      const std::vector<int64_t>& logprob_starts, std::optional<PrefillCacheRows> cache,
                                      PyObject* stream, PyObject* device);

}  // namespace pinstage

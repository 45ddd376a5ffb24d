// The logits processor's index tensors for a prefill with input logprobs, from per-request extend
// lengths and logprob starts, as SGLang's LogitsProcessor computes them (see pinstage/builders/logits.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <tuple>

namespace pinstage {

// One value per request each. Returns CPU int64 tensors (sample_indices [bs],
// input_logprob_indices [sum(lens - starts)], pruned_lens [bs], pruned_row_indices [kept rows]).
// ValueError naming the request for a length < 1 or a start outside [0, length], or for columns of
// different lengths; RuntimeError where the lengths add up past 2**63 - 1. The caller owns the
// values for the call: they are read twice (to size the outputs, then to fill them).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprob_indices(c10::ArrayRef<int64_t> len,
                                                                           c10::ArrayRef<int64_t> start);

}  // namespace pinstage

// The logits processor's index tensors for a prefill with input logprobs, from per-request extend
// lengths and logprob starts, as SGLang's LogitsProcessor computes them (see pinstage/builders/logits.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace pinstage {

// lens, starts: CPU int64 1-D tensors of one value per request. Returns CPU int64 tensors
// (sample_indices [bs], input_logprob_indices [sum(lens - starts)], pruned_lens [bs],
// pruned_row_indices [kept rows]). ValueError naming the request for a length < 1 or a start
// outside [0, length], RuntimeError where the lengths add up past 2**63 - 1. Each value is read
// once, into the op's own memory.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprob_indices(const at::Tensor& lens,
                                                                           const at::Tensor& starts);

}  // namespace pinstage

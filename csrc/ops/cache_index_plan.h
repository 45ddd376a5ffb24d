// cache_index_plan: validates a write_cache_indices batch on the host, before anything is staged
// (values the CUDA op cannot read without waiting: rows, lengths, prefix lengths), and computes each
// request's start in out_cache_loc.
#pragma once

#include <ATen/core/Tensor.h>

namespace pinstage {

// prefix_tensors: one int64 1-D tensor per request, on req_to_token's device; the per-request
// values are CPU int64 tensors. Returns out_cache_offsets, a CPU int64 tensor. The
// prefix tensors and the device tensors are inspected, never read.
at::Tensor cache_index_plan(const at::Tensor& req_to_token, at::TensorList prefix_tensors,
                            const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                            const at::Tensor& seq_lens, const at::Tensor& extend_lens, const at::Tensor& out_cache_loc);

}  // namespace pinstage

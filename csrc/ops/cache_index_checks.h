// The checks that write_cache_indices and its host-side plan share, with one message each.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "convert/dtypes.h"
#include "convert/tensor_memory.h"

namespace pinstage {

inline constexpr const char* kOp = "write_cache_indices";

inline void check_req_to_token(const at::Tensor& req_to_token) {
  TORCH_CHECK_TYPE(req_to_token.scalar_type() == at::kInt, kOp, ": req_to_token must be torch.int32, got ",
                   dtype_name(req_to_token.scalar_type()));
  TORCH_CHECK_VALUE(req_to_token.dim() == 2, kOp, ": req_to_token must be 2-D [rows, max_context_len], got shape ",
                    req_to_token.sizes());
  TORCH_CHECK_VALUE(req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1, kOp,
                    ": req_to_token's rows must be contiguous (stride(1) == 1), got strides ", req_to_token.strides());
}

inline void check_out_cache_loc(const at::Tensor& out_cache_loc, const at::Device& device) {
  TORCH_CHECK_TYPE(out_cache_loc.scalar_type() == at::kLong, kOp, ": out_cache_loc must be torch.int64, got ",
                   dtype_name(out_cache_loc.scalar_type()));
  TORCH_CHECK_VALUE(out_cache_loc.dim() == 1 && out_cache_loc.is_contiguous(), kOp,
                    ": out_cache_loc must be a contiguous 1-D tensor, got shape ", out_cache_loc.sizes(), " strides ",
                    out_cache_loc.strides());
  TORCH_CHECK_VALUE(out_cache_loc.device() == device, kOp, ": out_cache_loc is on ", out_cache_loc.device(),
                    " but req_to_token is on ", device);
}

// One value per request: a contiguous 1-D tensor of `batch` elements of `dtype` on `device` (or on
// the CPU where `cpu_too`: the CUDA op copies those itself).
inline void check_per_request(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t batch,
                              const at::Device& device, bool cpu_too = false) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, kOp, ": ", name, " must be ", dtype_name(dtype), ", got ",
                   dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() == batch && t.is_contiguous(), kOp, ": ", name,
                    " must be a contiguous 1-D tensor of ", batch, " elements (one per request), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device || (cpu_too && t.is_cpu()), kOp, ": ", name, " is on ", t.device(),
                    " but req_to_token is on ", device);
}

// An empty prefix (a request without a cached one) is never read: any device will do, as SGLang
// passes one empty CPU tensor for all of them. A meta tensor among real ones routes the call to the
// op's fake kernel, which refuses it by this same check.
inline void check_prefix_device(int64_t i, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device || (t.numel() == 0 && !t.is_meta()), kOp, ": request ", i,
                    ": prefix_tensors entry is on ", t.device(), " but req_to_token is on ", device);
}

// Request i's cached prefix, whose address the op takes: an int64 1-D tensor on `device` with real
// memory of its own (a wrapper subclass or a fake tensor has a Python dispatch key and often a null
// data pointer; the kernel would read address 0). Checks metadata only, never values.
inline void check_prefix_tensor(int64_t i, const at::Tensor& t, const at::Device& device) {
  check_prefix_device(i, t, device);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, kOp, ": request ", i,
                   ": prefix_tensors entry must be torch.int64, got ", dtype_name(t.scalar_type()));
  TORCH_CHECK_TYPE(has_real_memory(t), kOp, ": request ", i,
                   ": prefix_tensors entry has no memory of its own (a tensor subclass wrapping others, a fake or "
                   "zero tensor); pass the tensor that holds the slots");
  TORCH_CHECK_VALUE(t.dim() == 1, kOp, ": request ", i, ": prefix_tensors entry must be 1-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.numel() <= 1 || t.stride(0) == 1, kOp, ": request ", i,
                    ": prefix_tensors entry must be contiguous, got stride ", t.stride(0));
}

// One request's row and its [0, prefix_len) + [prefix_len, seq_len) span of that row: checked by
// cache_index_plan (before anything is staged) and by the CPU op, with one message.
inline void check_request_span(int64_t i, int64_t row, int64_t prefix_len, int64_t seq_len, int64_t rows,
                        int64_t max_context_len) {
  TORCH_CHECK_INDEX(row >= 0 && row < rows, kOp, ": request ", i, ": req_pool_indices is ", row,
                    ", outside req_to_token's ", rows, " rows");
  TORCH_CHECK_VALUE(prefix_len >= 0, kOp, ": request ", i, ": prefix_lens is negative (", prefix_len, ")");
  TORCH_CHECK_VALUE(seq_len >= prefix_len, kOp, ": request ", i, ": seq_lens (", seq_len, ") < prefix_lens (",
                    prefix_len, ")");
  TORCH_CHECK_VALUE(seq_len <= max_context_len, kOp, ": request ", i, ": seq_lens (", seq_len,
                    ") > req_to_token's max_context_len (", max_context_len, ")");
}

}  // namespace pinstage

// write_cache_indices: fill request-to-token rows with KV slot indices, for a whole batch at once.
//
// Row req_pool_indices[i] of req_to_token (int32 [rows, max_context_len]) receives request i's cached
// prefix (an int64 tensor reached through prefix_pointers[i]) at [0, prefix_lens[i]) and its slice
// out_cache_loc[out_cache_offsets[i] : out_cache_offsets[i] + seq_lens[i] - prefix_lens[i]] at
// [prefix_lens[i], seq_lens[i]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <optional>

// nvcc never needs the Python side, and keeping pybind11 out of the .cu keeps its compile short.
#ifndef __CUDACC__
#include <pybind11/pybind11.h>

// Adds write_cache_indices and cache_index_plan to the extension module.
void bind_cache_indices(pybind11::module_& m);
#endif

namespace pinstage {

#ifdef PINSTAGE_WITH_CUDA
// One kernel launch for the batch, on `stream` or else the current stream of req_to_token's device.
// The caller has checked every tensor's dtype, shape and device; the values were checked on the host
// before they were staged, because reading them back here would make the host wait for the device.
void write_cache_indices_cuda(
    const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_pointers,
    const at::Tensor& prefix_lens,
    const at::Tensor& seq_lens,
    const at::Tensor& out_cache_offsets,
    const at::Tensor& out_cache_loc,
    std::optional<c10::Stream> stream);
#endif

}  // namespace pinstage

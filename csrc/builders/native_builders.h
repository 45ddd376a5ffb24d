// The builders' native gathers: per-request fields read from Python objects in C++, converted
// into host arrays and staged with one copy (stage_host_arrays), for backend="pinstage".
//
// Each returns None when it declines (see py_fields.h); the Python builder then takes its own path.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <cstdint>

namespace pinstage::builders {

// input_ids, int64 [bs]: each request's last output token, or its last prompt token before it has
// any output, from requests with origin_input_ids and output_ids (lists or tuples of ints).
pybind11::object stage_last_token_ids(pybind11::handle requests, pybind11::handle stream, pybind11::handle device);

// Batches stage_last_token_ids finished with each pass (GIL-serialised), for the tests to see which
// pass a batch takes.
struct LastTokenPasses {
  uint64_t grouped = 0;
  uint64_t one_by_one = 0;
};
LastTokenPasses& last_token_passes();

// [input_ids, seq_lens, req_pool_indices], int64 [bs] each, from requests that also have
// req_pool_idx (an int >= 0).
pybind11::object stage_decode_inputs(pybind11::handle requests, pybind11::handle stream, pybind11::handle device);

// ([temperatures [bs,1], top_ps, top_ks, min_ps(, seeds)], is_all_greedy, need_top_p, need_top_k,
// need_min_p) from objects with temperature, top_p, top_k, min_p and sampling_seed.
pybind11::object stage_sampling_batch(pybind11::handle params, bool with_seeds, int64_t top_k_all,
                                      int64_t default_seed, pybind11::handle stream, pybind11::handle device);

// Adds the gathers above to the extension module as private functions (_stage_*), positional only.
void bind_native_builders(pybind11::module_& m);

}  // namespace pinstage::builders

// cache_index_plan: validates a write_cache_indices batch on the host, before anything is staged,
// and computes what the op reads that only the host knows: the prefix tensors' data pointers and
// each request's start in out_cache_loc.
#pragma once

#include <pybind11/pybind11.h>

namespace pinstage {

// Adds _C.cache_index_plan.
void bind_cache_index_plan(pybind11::module_& m);

}  // namespace pinstage

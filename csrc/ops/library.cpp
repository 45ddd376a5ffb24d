// The torch.ops.pinstage operators: every tensor operation pinstage offers besides staging (which is
// pybind11's, in bindings/module.cpp). Each op's kernels are registered beside its code.
#include <torch/library.h>

TORCH_LIBRARY(pinstage, m) {
  // prefix_tensors are tensors, never addresses: the op takes each one's address itself, after
  // checking that it has memory of its own on req_to_token's device. out_cache_offsets=None: the
  // per-request values are CPU tensors, and the op checks them (extend_lens too, where given) and
  // computes the offsets itself.
  m.def(
      "write_cache_indices(Tensor(a!) req_to_token, Tensor req_pool_indices, Tensor[] prefix_tensors, "
      "Tensor prefix_lens, Tensor seq_lens, Tensor? out_cache_offsets, Tensor out_cache_loc, "
      "Tensor? extend_lens=None) -> ()");
  // Host-side: the checks write_cache_indices makes of CPU values, and the offsets it would compute
  // (for values staged to the device before the op; the device tensors are inspected, never read).
  m.def(
      "cache_index_plan(Tensor req_to_token, Tensor[] prefix_tensors, Tensor req_pool_indices, Tensor prefix_lens, "
      "Tensor seq_lens, Tensor extend_lens, Tensor out_cache_loc) -> Tensor");
  m.def(
      "logprob_indices(Tensor extend_seq_lens, Tensor extend_logprob_start_lens) -> (Tensor sample_indices, "
      "Tensor input_logprob_indices, Tensor pruned_lens, Tensor pruned_row_indices)");
}

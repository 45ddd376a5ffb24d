// The torch.ops.pinstage operator: write_cache_indices, which writes a device table on the caller's
// stream (staging and the builders' host halves are pybind11's, in bindings/module.cpp). Its kernels
// are registered beside its code.
#include <torch/library.h>

TORCH_LIBRARY(pinstage, m) {
  // prefix_tensors are tensors, never addresses: the op takes each one's address itself, after
  // checking that it has memory of its own on req_to_token's device. out_cache_offsets=None: the
  // per-request values are CPU tensors, and the op checks them (extend_lens too, where given) and
  // computes the offsets itself. The op reads each per-request value of a CPU tensor once, into
  // memory of its own, before checking or using it; write_cache_indices refuses a req_to_token whose
  // rows share memory or that overlaps an input.
  m.def(
      "write_cache_indices(Tensor(a!) req_to_token, Tensor req_pool_indices, Tensor[] prefix_tensors, "
      "Tensor prefix_lens, Tensor seq_lens, Tensor? out_cache_offsets, Tensor out_cache_loc, "
      "Tensor? extend_lens=None) -> ()");
}

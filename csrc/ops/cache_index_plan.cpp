#include "ops/cache_index_plan.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "ops/cache_index_checks.h"

namespace pinstage {

at::Tensor cache_index_plan(const at::Tensor& req_to_token, at::TensorList prefix_tensors,
                            const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                            const at::Tensor& seq_lens, const at::Tensor& extend_lens, const at::Tensor& out_cache_loc) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  check_out_cache_loc(out_cache_loc, device);
  const int64_t batch = req_pool_indices.numel();
  const std::pair<const char*, const at::Tensor*> per_request[] = {
      {"req_pool_indices", &req_pool_indices}, {"prefix_lens", &prefix_lens}, {"seq_lens", &seq_lens},
      {"extend_lens", &extend_lens}};
  for (const auto& [name, t] : per_request) {
    TORCH_CHECK_VALUE(t->numel() == batch, kOp, ": ", name, " has ", t->numel(), " entries but req_pool_indices has ",
                      batch);
    check_per_request(*t, name, at::kLong, batch, at::Device(at::kCPU));
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(prefix_tensors.size()) == batch, kOp, ": prefix_tensors has ",
                    prefix_tensors.size(), " entries but req_pool_indices has ", batch);
  const int64_t* rows_of = req_pool_indices.const_data_ptr<int64_t>();
  const int64_t* prefix = prefix_lens.const_data_ptr<int64_t>();
  const int64_t* seq_len = seq_lens.const_data_ptr<int64_t>();
  const int64_t* extend = extend_lens.const_data_ptr<int64_t>();

  at::Tensor offsets = at::empty({batch}, at::TensorOptions().dtype(at::kLong));
  auto* offset_out = offsets.data_ptr<int64_t>();
  int64_t running = 0;
  for (int64_t i = 0; i < batch; ++i) {
    check_request_span(i, rows_of[i], prefix[i], seq_len[i], req_to_token.size(0), req_to_token.size(1));
    TORCH_CHECK_VALUE(extend[i] == seq_len[i] - prefix[i], kOp, ": request ", i, ": extend_lens (", extend[i],
                      ") != seq_lens - prefix_lens (", seq_len[i], " - ", prefix[i], ")");
    const at::Tensor& cached = prefix_tensors[static_cast<size_t>(i)];
    check_prefix_tensor(i, cached, device);
    TORCH_CHECK_VALUE(cached.numel() >= prefix[i], kOp, ": request ", i, ": prefix_tensors entry has ",
                      cached.numel(), " elements but prefix_lens is ", prefix[i]);
    offset_out[i] = running;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(running, extend[i], &running), kOp,
                      ": extend_lens add up to more than 2**63");
  }
  TORCH_CHECK_VALUE(running == out_cache_loc.numel(), kOp, ": extend_lens add up to ", running,
                    " but out_cache_loc has ", out_cache_loc.numel(), " elements");
  return offsets;
}

}  // namespace pinstage

// Never reads device memory, so one kernel serves req_to_token on any device.
TORCH_LIBRARY_IMPL(pinstage, CompositeExplicitAutograd, m) { m.impl("cache_index_plan", &pinstage::cache_index_plan); }

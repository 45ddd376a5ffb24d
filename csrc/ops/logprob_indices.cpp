#include "ops/logprob_indices.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>

namespace pinstage {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprob_indices(const at::Tensor& lens,
                                                                           const at::Tensor& starts) {
  for (const at::Tensor* t : {&lens, &starts}) {
    TORCH_CHECK_TYPE(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                     "logprob_indices: lengths must be contiguous 1-D CPU int64 tensors");
  }
  const int64_t bs = lens.numel();
  TORCH_CHECK_VALUE(starts.numel() == bs, "extend_seq_lens has ", bs, " entries but extend_logprob_start_lens has ",
                    starts.numel());
  const int64_t* len = lens.const_data_ptr<int64_t>();
  const int64_t* start = starts.const_data_ptr<int64_t>();
  int64_t kept_total = 0;
  int64_t logprob_total = 0;
  for (int64_t i = 0; i < bs; ++i) {
    TORCH_CHECK_VALUE(len[i] >= 1, "request ", i, ": extend_seq_lens must be >= 1, got ", len[i]);
    TORCH_CHECK_VALUE(start[i] >= 0 && start[i] <= len[i], "request ", i,
                      ": extend_logprob_start_lens must be in [0, extend_seq_lens=", len[i], "], got ", start[i]);
    const int64_t pruned = len[i] - start[i];
    TORCH_CHECK_VALUE(!__builtin_add_overflow(kept_total, pruned == 0 ? 1 : pruned, &kept_total) &&
                          !__builtin_add_overflow(logprob_total, pruned, &logprob_total),
                      "extend_seq_lens add up to more than 2**63");
  }
  const auto options = at::TensorOptions().dtype(at::kLong);
  at::Tensor sample = at::empty({bs}, options);
  at::Tensor input_logprob = at::empty({logprob_total}, options);
  at::Tensor pruned_lens = at::empty({bs}, options);
  at::Tensor rows = at::empty({kept_total}, options);
  int64_t* sample_out = sample.data_ptr<int64_t>();
  int64_t* logprob_out = input_logprob.data_ptr<int64_t>();
  int64_t* pruned_out = pruned_lens.data_ptr<int64_t>();
  int64_t* rows_out = rows.data_ptr<int64_t>();
  int64_t row = 0;   // first hidden-state row of request i
  int64_t kept = 0;  // kept rows before request i
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t pruned = len[i] - start[i];
    // A request with no input logprob (start == length) still keeps its last row, to sample from.
    const int64_t kept_from = pruned == 0 ? start[i] - 1 : start[i];
    const int64_t kept_len = len[i] - kept_from;
    for (int64_t k = 0; k < kept_len; ++k) *rows_out++ = row + kept_from + k;
    for (int64_t k = 0; k < pruned; ++k) *logprob_out++ = kept + k;
    pruned_out[i] = pruned;
    kept += kept_len;
    sample_out[i] = kept - 1;
    row += len[i];
  }
  return {sample, input_logprob, pruned_lens, rows};
}

}  // namespace pinstage

TORCH_LIBRARY_IMPL(pinstage, CPU, m) { m.impl("logprob_indices", &pinstage::logprob_indices); }

#include "ops/logprob_indices.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace pinstage {
namespace {

// The column's values, read once into memory of the op's own: the op runs with the GIL released,
// and another thread writing the caller's tensor between the pass that sizes the outputs and the
// pass that fills them would make the outputs too small.
std::vector<int64_t> copy_of(const at::Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), t.const_data_ptr<int64_t>(), out.size() * sizeof(int64_t));
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprob_indices(const at::Tensor& lens,
                                                                           const at::Tensor& starts) {
  for (const auto& [name, t] : {std::pair{"extend_seq_lens", &lens}, std::pair{"extend_logprob_start_lens", &starts}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, "logprob_indices: ", name, " must be int64, got ",
                     t->scalar_type());
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->dim() == 1 && t->is_contiguous(), "logprob_indices: ", name,
                      " must be a contiguous 1-D CPU tensor, got shape ", t->sizes(), " on ", t->device());
  }
  const int64_t bs = lens.numel();
  TORCH_CHECK_VALUE(starts.numel() == bs, "extend_seq_lens has ", bs, " entries but extend_logprob_start_lens has ",
                    starts.numel());
  const std::vector<int64_t> len = copy_of(lens);
  const std::vector<int64_t> start = copy_of(starts);
  int64_t rows_total = 0;  // hidden-state rows: every index below is smaller
  int64_t kept_total = 0;
  int64_t logprob_total = 0;
  for (size_t i = 0; i < len.size(); ++i) {
    TORCH_CHECK_VALUE(len[i] >= 1, "request ", i, ": extend_seq_lens must be >= 1, got ", len[i]);
    TORCH_CHECK_VALUE(start[i] >= 0 && start[i] <= len[i], "request ", i,
                      ": extend_logprob_start_lens must be in [0, extend_seq_lens=", len[i], "], got ", start[i]);
    // A request keeps at most its rows (1 <= max(pruned, 1) <= len): the kept and input-logprob
    // counts cannot overflow once the rows' total does not.
    const int64_t before = rows_total;
    TORCH_CHECK(!__builtin_add_overflow(rows_total, len[i], &rows_total), "request ", i, ": extend_seq_lens ", len[i],
                " after ", before, " rows of the requests before it: the row index passes 2**63 - 1");
    const int64_t pruned = len[i] - start[i];
    kept_total += pruned == 0 ? 1 : pruned;
    logprob_total += pruned;
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
  for (size_t i = 0; i < len.size(); ++i) {
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

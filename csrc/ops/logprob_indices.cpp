#include "ops/logprob_indices.h"

#include <ATen/EmptyTensor.h>

#include <cstdint>

namespace pinstage {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprob_indices(c10::ArrayRef<int64_t> len,
                                                                           c10::ArrayRef<int64_t> start) {
  const int64_t bs = static_cast<int64_t>(len.size());
  TORCH_CHECK_VALUE(start.size() == len.size(), "extend_seq_lens has ", bs,
                    " entries but extend_logprob_start_lens has ", start.size());
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
  // Made without the dispatcher: a scheduler step calls this with its caches cold, where every
  // layer of torch's code a call runs costs microseconds (docs/design.md, Measuring in a loop).
  auto empty = [](int64_t n) { return at::Tensor(at::detail::empty_cpu({n}, at::kLong)); };
  at::Tensor sample = empty(bs);
  at::Tensor input_logprob = empty(logprob_total);
  at::Tensor pruned_lens = empty(bs);
  at::Tensor rows = empty(kept_total);
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

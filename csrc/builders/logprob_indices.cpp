// The logits processor's index tensors for prefill with input logprobs (pinstage/builders/logits.py
// states the rules and a worked example), computed in one pass over the requests.
#include "native_builders.h"

#include <vector>

#include "../stage.h"
#include "../target.h"
#include "py_fields.h"

namespace py = pybind11;

namespace pinstage::builders {

py::object stage_logprob_indices(py::handle extend_seq_lens, py::handle extend_logprob_start_lens, py::handle stream,
                                 py::handle device) {
  // First: it can run Python code (CUDA's lazy initialisation). After it, nothing below runs
  // Python code (exact ints only), so the borrowed items stay valid.
  const Target target = resolve_target(stream.ptr(), device.ptr());
  Py_ssize_t bs = 0, n_starts = 0;
  PyObject** len_items = nullptr;
  PyObject** start_items = nullptr;
  if (!as_list_or_tuple(extend_seq_lens.ptr(), &bs, &len_items) ||
      !as_list_or_tuple(extend_logprob_start_lens.ptr(), &n_starts, &start_items) || n_starts != bs) {
    return py::none();
  }

  // First pass: read and check every request, and size the two ragged outputs.
  const size_t n = static_cast<size_t>(bs);
  std::vector<int64_t> lens(n), starts(n);
  int64_t total_kept = 0, total_logprobs = 0;
  // Sums stay far from int64 overflow; a batch this large is left to the Python builder.
  constexpr int64_t kMaxRows = int64_t{1} << 40;
  for (size_t i = 0; i < n; ++i) {
    if (!exact_int(len_items[i], &lens[i]) || !exact_int(start_items[i], &starts[i])) return py::none();
    if (lens[i] < 1 || starts[i] < 0 || starts[i] > lens[i] || lens[i] > kMaxRows) return py::none();
    const int64_t sample_only = starts[i] == lens[i] ? 1 : 0;  // keep one row to sample from
    total_kept += lens[i] - starts[i] + sample_only;
    total_logprobs += lens[i] - starts[i];
    if (total_kept > kMaxRows) return py::none();
  }

  std::vector<int64_t> sample_indices(n), pruned_lens(n);
  std::vector<int64_t> rows(static_cast<size_t>(total_kept)), logprob_rows(static_cast<size_t>(total_logprobs));
  int64_t hidden_end = 0, kept = 0;
  int64_t* row = rows.data();
  int64_t* logprob_row = logprob_rows.data();
  for (size_t i = 0; i < n; ++i) {
    const int64_t sample_only = starts[i] == lens[i] ? 1 : 0;
    const int64_t pruned = lens[i] - starts[i] + sample_only;
    hidden_end += lens[i];
    // The request's kept hidden rows are the last `pruned` of its extend rows...
    for (int64_t r = hidden_end - pruned; r < hidden_end; ++r) *row++ = r;
    // ...and the first (len - start) of them, in kept order, carry an input logprob.
    for (int64_t k = kept; k < kept + lens[i] - starts[i]; ++k) *logprob_row++ = k;
    kept += pruned;
    sample_indices[i] = kept - 1;
    pruned_lens[i] = pruned;
  }

  const std::vector<HostArray> arrays{
      {sample_indices.data(), c10::kLong, {bs}},
      {logprob_rows.data(), c10::kLong, {total_logprobs}},
      {pruned_lens.data(), c10::kLong, {bs}},
      {rows.data(), c10::kLong, {total_kept}},
  };
  return py::cast(stage_host_arrays(arrays, target, "pinstage::builders::logprob_indices"));
}

}  // namespace pinstage::builders

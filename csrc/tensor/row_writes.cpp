// StaticInputs' row writes: write_rows() checks and keeps a batch of writes into persistent fields;
// the next stage() packs them behind the step's values in its one ring region (see row_writes.h).
#include <algorithm>
#include <cstring>

#include "python/error_prefix.h"
#include "ring/options.h"
#include "tensor/staging_scope.h"
#include "tensor/static_inputs.h"

namespace pinstage {

namespace {

// A sequence argument (a list, a numpy array, a tensor: any iterable but text) as a tuple of its
// own: Python code run later (an __index__) cannot change it.
THPObjectPtr as_tuple(PyObject* seq, const char* what) {
  const bool text = PyUnicode_Check(seq) || PyBytes_Check(seq);
  PyObject* tuple = text ? nullptr : PySequence_Tuple(seq);
  if (tuple == nullptr) {
    if (!text && !PyErr_ExceptionMatches(PyExc_TypeError)) throw PythonError();
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, kWriteRows, ": ", what, " must be a sequence, got ", Py_TYPE(seq)->tp_name);
  }
  return THPObjectPtr(tuple);
}

}  // namespace

void StaticInputs::write_rows(PyObject* name, PyObject* rows_arg_, PyObject* starts_arg, PyObject* values_arg) {
  const StagingScope scope(staging_, kWriteRows);
  TORCH_CHECK_TYPE(PyUnicode_Check(name), kWriteRows, ": the field name must be str, got ", Py_TYPE(name)->tp_name);
  const Field& f = field_named(name, kWriteRows);
  const size_t field = static_cast<size_t>(&f - fields_.data());
  const THPObjectPtr rows = as_tuple(rows_arg_, "rows");
  const THPObjectPtr starts = as_tuple(starts_arg, "starts");
  const THPObjectPtr values = as_tuple(values_arg, "values");
  const Py_ssize_t count = PyTuple_GET_SIZE(values.get());
  TORCH_CHECK_VALUE(PyTuple_GET_SIZE(rows.get()) == count && PyTuple_GET_SIZE(starts.get()) == count, kWriteRows, ": ",
                    f.label(), ": rows, starts and values must have one entry per write, got ",
                    PyTuple_GET_SIZE(rows.get()), ", ", PyTuple_GET_SIZE(starts.get()), " and ", count);
  // Appended in place and cut back on any error: nothing of a failed call is kept.
  const size_t kept = pending_.size();
  const size_t kept_bytes = pending_bytes_.size();
  const size_t element = c10::elementSize(f.dtype);
  try {
    for (Py_ssize_t i = 0; i < count; ++i) {
      // Built only for an error: a step writes many rows.
      const auto where = [&] { return std::string(kWriteRows) + ": " + f.label() + ": write " + std::to_string(i); };
      int64_t row = 0, start = 0;
      with_error_prefix(where, [&] {
        row = index_arg(PyTuple_GET_ITEM(rows.get(), i), max_bs_ - 1, "", "row");
        start = index_arg(PyTuple_GET_ITEM(starts.get(), i), f.row_numel, "", "start");
      });
      with_error_prefix(
          [&] { return where() + " (row " + std::to_string(row) + ", start " + std::to_string(start) + ")"; },
          [&] {
            ItemPlan plan = plan_item(PyTuple_GET_ITEM(values.get(), i), f.dtype);
            TORCH_CHECK_VALUE(plan.shape.size() == 1, "values must be a 1-D sequence, got shape ",
                              c10::IntArrayRef(plan.shape));
            TORCH_CHECK_VALUE(plan.numel <= f.row_numel - start, plan.numel, " values from element ", start,
                              " run past the row's ", f.row_numel, " elements (row shape ",
                              c10::IntArrayRef(f.row_shape), ")");
            const size_t src = align_up(pending_bytes_.size(), kStagingAlignment);
            pending_bytes_.resize(src + plan.nbytes);
            write_fresh_item(plan, plan.nbytes > 0 ? pending_bytes_.data() + src : nullptr);
            const size_t dst = f.offset + static_cast<size_t>(row) * f.row_bytes + static_cast<size_t>(start) * element;
            pending_.push_back(PendingWrite{field, row, dst, src, plan.nbytes});
          });
    }
  } catch (...) {
    pending_.resize(kept);
    pending_bytes_.resize(kept_bytes);
    throw;
  }
}

#ifdef PINSTAGE_WITH_CUDA
// Packed writes: records (every group one write of at most kRecordValues bytes), else
// [RowWriteOp per write, in plan order][group starts][the writes' values as pending_bytes_ holds them].
namespace {

size_t contents_at(size_t writes) {
  return align_up(writes * sizeof(RowWriteOp) + (writes + 1) * sizeof(uint32_t), kStagingAlignment);
}

}  // namespace

bool StaticInputs::writes_persistent() const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const PendingWrite& w) { return fields_[w.field].persistent; });
}

StaticInputs::WritePlan StaticInputs::plan_writes() const {
  WritePlan plan;
  size_t longest = 0;
  for (size_t k = 0; k < pending_.size(); ++k) {
    if (!fields_[pending_[k].field].persistent) continue;
    plan.order.push_back(static_cast<uint32_t>(k));
    longest = std::max(longest, pending_[k].nbytes);
  }
  // One block per group, and a grid has at most 2**31 - 1 of them.
  TORCH_CHECK(plan.order.size() < (size_t{1} << 31), kStage, ": ", plan.order.size(),
              " row writes in one stage; at most 2**31 - 1 are applied at once");
  // The writes into one row stay in call order, in one group: a block applies them one after another.
  std::stable_sort(plan.order.begin(), plan.order.end(), [&](uint32_t a, uint32_t b) {
    const PendingWrite& x = pending_[a];
    const PendingWrite& y = pending_[b];
    return x.field != y.field ? x.field < y.field : x.row < y.row;
  });
  for (size_t j = 0; j < plan.order.size(); ++j) {
    const PendingWrite& w = pending_[plan.order[j]];
    const PendingWrite* before = j > 0 ? &pending_[plan.order[j - 1]] : nullptr;
    if (before == nullptr || before->field != w.field || before->row != w.row) {
      plan.starts.push_back(static_cast<uint32_t>(j));
    }
  }
  plan.records = plan.starts.size() == plan.order.size() && longest <= kRecordValues;
  plan.starts.push_back(static_cast<uint32_t>(plan.order.size()));
  plan.bytes = plan.records ? plan.order.size() * kRecordBytes : contents_at(plan.order.size()) + pending_bytes_.size();
  return plan;
}

RowWriteParams StaticInputs::pack_writes(const WritePlan& plan, uint8_t* packed, uint8_t* allocation) const {
  const auto groups = static_cast<uint32_t>(plan.starts.size() - 1);
  RowWriteParams params{allocation, nullptr, nullptr, nullptr, nullptr, groups};
  const size_t count = plan.order.size();
  if (plan.records) {
    auto* records = reinterpret_cast<RowWriteRecord*>(packed);
    for (size_t j = 0; j < count; ++j) {
      const PendingWrite& w = pending_[plan.order[j]];
      records[j].dst = w.dst;
      records[j].nbytes = w.nbytes;
      if (w.nbytes > 0) std::memcpy(records[j].values, pending_bytes_.data() + w.src, w.nbytes);
    }
    params.records = records;
    return params;
  }
  auto* ops = reinterpret_cast<RowWriteOp*>(packed);
  auto* starts = reinterpret_cast<uint32_t*>(packed + count * sizeof(RowWriteOp));
  for (size_t j = 0; j < count; ++j) {
    const PendingWrite& w = pending_[plan.order[j]];
    ops[j] = RowWriteOp{w.dst, w.src, w.nbytes};
  }
  std::memcpy(starts, plan.starts.data(), plan.starts.size() * sizeof(uint32_t));
  if (!pending_bytes_.empty()) std::memcpy(packed + contents_at(count), pending_bytes_.data(), pending_bytes_.size());
  params.ops = ops;
  // Every group one write: the kernel skips the group starts, one trip over the bus less.
  params.group_starts = groups == count ? nullptr : starts;
  params.contents = packed + contents_at(count);
  return params;
}
#endif  // PINSTAGE_WITH_CUDA

}  // namespace pinstage

// write_cache_indices: argument checks, the CPU path, and cache_index_plan, which validates the
// host-side request data and turns it into what the kernel reads (prefix data pointers, offsets).
#include <torch/extension.h>

#include "cache_indices.h"
#include "stage.h"
#include "target.h"
#include "tensor_check.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace py = pybind11;

namespace {

constexpr const char* kOp = "write_cache_indices";

void check_req_to_token(const at::Tensor& req_to_token) {
  TORCH_CHECK_TYPE(
      req_to_token.scalar_type() == at::kInt, kOp, ": req_to_token must be int32, got ",
      req_to_token.scalar_type());
  TORCH_CHECK_VALUE(
      req_to_token.dim() == 2, kOp, ": req_to_token must be 2-D [rows, max_context_len], got shape ",
      req_to_token.sizes());
  TORCH_CHECK_VALUE(
      req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1, kOp,
      ": req_to_token's rows must be contiguous (stride(1) == 1), got strides ", req_to_token.strides());
}

void check_out_cache_loc(const at::Tensor& out_cache_loc, const at::Device& device) {
  TORCH_CHECK_TYPE(
      out_cache_loc.scalar_type() == at::kLong, kOp, ": out_cache_loc must be int64, got ",
      out_cache_loc.scalar_type());
  TORCH_CHECK_VALUE(
      out_cache_loc.dim() == 1 && out_cache_loc.is_contiguous(), kOp,
      ": out_cache_loc must be a contiguous 1-D tensor, got shape ", out_cache_loc.sizes(), " strides ",
      out_cache_loc.strides());
  TORCH_CHECK_VALUE(
      out_cache_loc.device() == device, kOp, ": out_cache_loc is on ", out_cache_loc.device(),
      " but req_to_token is on ", device);
}

// The per-request tensors the kernel reads: same length, dtype as expected, on req_to_token's device.
void check_per_request(
    const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t batch, const at::Device& device) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, kOp, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(
      t.dim() == 1 && t.numel() == batch && t.is_contiguous(), kOp, ": ", name,
      " must be a contiguous 1-D tensor of ", batch, " elements (one per request), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device, kOp, ": ", name, " is on ", t.device(), " but req_to_token is on ", device);
}

// One request's row and its [0, prefix_len) + [prefix_len, seq_len) span of that row: checked on the
// host by cache_index_plan (before staging) and by the CPU path (for direct calls), with one message.
void check_request_span(
    int64_t i, int64_t row, int64_t prefix_len, int64_t seq_len, int64_t rows, int64_t max_context_len) {
  TORCH_CHECK_INDEX(
      row >= 0 && row < rows, kOp, ": request ", i, ": req_pool_indices is ", row, ", outside req_to_token's ", rows,
      " rows");
  TORCH_CHECK_VALUE(prefix_len >= 0, kOp, ": request ", i, ": prefix_lens is negative (", prefix_len, ")");
  TORCH_CHECK_VALUE(
      seq_len >= prefix_len, kOp, ": request ", i, ": seq_lens (", seq_len, ") < prefix_lens (", prefix_len, ")");
  TORCH_CHECK_VALUE(
      seq_len <= max_context_len, kOp, ": request ", i, ": seq_lens (", seq_len,
      ") > req_to_token's max_context_len (", max_context_len, ")");
}

// Every value is checked before the first write, so a bad request leaves req_to_token untouched.
void check_cpu_values(
    const at::Tensor& req_to_token,
    const int64_t* rows_of,
    const uint64_t* prefix_pointers,
    const int64_t* prefix_lens,
    const int64_t* seq_lens,
    const int64_t* out_cache_offsets,
    int64_t batch,
    int64_t out_cache_len) {
  const int64_t rows = req_to_token.size(0);
  const int64_t max_context_len = req_to_token.size(1);
  for (int64_t i = 0; i < batch; ++i) {
    check_request_span(i, rows_of[i], prefix_lens[i], seq_lens[i], rows, max_context_len);
    // Bounds as subtractions that cannot overflow: 0 <= prefix <= seq was checked above.
    const int64_t extend_len = seq_lens[i] - prefix_lens[i];
    TORCH_CHECK_VALUE(
        out_cache_offsets[i] >= 0 && out_cache_offsets[i] <= out_cache_len &&
            extend_len <= out_cache_len - out_cache_offsets[i],
        kOp, ": request ", i, ": out_cache_offsets is ", out_cache_offsets[i], " with ", extend_len,
        " new tokens, outside out_cache_loc (", out_cache_len, " elements)");
    TORCH_CHECK_VALUE(
        prefix_lens[i] == 0 || prefix_pointers[i] != 0, kOp, ": request ", i,
        ": prefix_pointers is null but prefix_lens is ", prefix_lens[i]);
  }
}

void write_cache_indices_cpu(
    const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_pointers,
    const at::Tensor& prefix_lens,
    const at::Tensor& seq_lens,
    const at::Tensor& out_cache_offsets,
    const at::Tensor& out_cache_loc) {
  const int64_t batch = req_pool_indices.numel();
  const int64_t* rows_of = req_pool_indices.const_data_ptr<int64_t>();
  const uint64_t* pointers = static_cast<const uint64_t*>(prefix_pointers.const_data_ptr());
  const int64_t* prefix = prefix_lens.const_data_ptr<int64_t>();
  const int64_t* seq = seq_lens.const_data_ptr<int64_t>();
  const int64_t* offsets = out_cache_offsets.const_data_ptr<int64_t>();
  const int64_t* out = out_cache_loc.const_data_ptr<int64_t>();
  check_cpu_values(req_to_token, rows_of, pointers, prefix, seq, offsets, batch, out_cache_loc.numel());

  int32_t* table = req_to_token.data_ptr<int32_t>();
  const int64_t row_stride = req_to_token.stride(0);
  for (int64_t i = 0; i < batch; ++i) {
    int32_t* dst = table + rows_of[i] * row_stride;
    const int64_t* cached = reinterpret_cast<const int64_t*>(pointers[i]);
    for (int64_t pos = 0; pos < prefix[i]; ++pos) {
      dst[pos] = static_cast<int32_t>(cached[pos]);
    }
    const int64_t* extend = out + offsets[i];
    for (int64_t pos = prefix[i]; pos < seq[i]; ++pos) {
      dst[pos] = static_cast<int32_t>(extend[pos - prefix[i]]);
    }
  }
}

void write_cache_indices(
    const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_pointers,
    const at::Tensor& prefix_lens,
    const at::Tensor& seq_lens,
    const at::Tensor& out_cache_offsets,
    const at::Tensor& out_cache_loc,
    std::optional<c10::Stream> stream) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  const int64_t batch = req_pool_indices.numel();
  check_per_request(req_pool_indices, "req_pool_indices", at::kLong, batch, device);
  check_per_request(prefix_pointers, "prefix_pointers", at::kUInt64, batch, device);
  check_per_request(prefix_lens, "prefix_lens", at::kLong, batch, device);
  check_per_request(seq_lens, "seq_lens", at::kLong, batch, device);
  check_per_request(out_cache_offsets, "out_cache_offsets", at::kLong, batch, device);
  check_out_cache_loc(out_cache_loc, device);
  TORCH_CHECK_VALUE(
      !stream.has_value() || stream->device() == device, kOp, ": stream is on ",
      stream.has_value() ? stream->device() : device, " but req_to_token is on ", device);

  if (device.is_cuda()) {
#ifdef PINSTAGE_WITH_CUDA
    pinstage::write_cache_indices_cuda(
        req_to_token, req_pool_indices, prefix_pointers, prefix_lens, seq_lens, out_cache_offsets, out_cache_loc,
        stream);
    return;
#else
    TORCH_CHECK(false, kOp, ": req_to_token is on ", device, " but pinstage was built without CUDA");
#endif
  }
  TORCH_CHECK(device.is_cpu(), kOp, ": unsupported device ", device);
  write_cache_indices_cpu(
      req_to_token, req_pool_indices, prefix_pointers, prefix_lens, seq_lens, out_cache_offsets, out_cache_loc);
}

// A tuple of ints (from as_fast_sequence) as int64 values; errors name the field and the request.
std::vector<int64_t> int64_values(PyObject* fast, const char* field) {
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      TORCH_CHECK_TYPE(
          false, kOp, ": request ", i, ": ", field, " must be an int in the int64 range, got ",
          Py_TYPE(items[i])->tp_name);
    }
    values[static_cast<size_t>(i)] = v;
  }
  return values;
}

// A tuple of the sequence's items, owned: reading an item can run Python code (an int's __index__),
// which must not be able to resize or free what is still to be read.
py::object as_fast_sequence(const py::handle& seq, const char* field) {
  PyObject* fast = PySequence_Tuple(seq.ptr());
  if (fast == nullptr) {
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, kOp, ": ", field, " must be a sequence, got ", Py_TYPE(seq.ptr())->tp_name);
  }
  return py::reinterpret_steal<py::object>(fast);
}

// A write_cache_indices batch as the kernel reads it, validated on the host.
struct CacheIndexPlan {
  std::vector<int64_t> rows_of, prefix_lens, seq_lens;
  std::vector<uint64_t> prefix_pointers;  // data pointers of the prefix tensors
  std::vector<int64_t> out_cache_offsets;  // each request's start in out_cache_loc
};

// Validates the batch as the host sees it, before anything is staged or written, and computes the
// uint64 data pointers of the prefix tensors and each request's offset into out_cache_loc (one
// running sum, so the kernel never re-sums earlier requests).
CacheIndexPlan plan_cache_indices(
    const at::Tensor& req_to_token,
    const py::handle& req_pool_indices,
    const py::handle& prefix_tensors,
    const py::handle& prefix_lens,
    const py::handle& seq_lens,
    const py::handle& extend_lens,
    const at::Tensor& out_cache_loc) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  check_out_cache_loc(out_cache_loc, device);

  const py::object rows_seq = as_fast_sequence(req_pool_indices, "req_pool_indices");
  const py::object tensors_seq = as_fast_sequence(prefix_tensors, "prefix_tensors");
  const py::object prefix_seq = as_fast_sequence(prefix_lens, "prefix_lens");
  const py::object seq_seq = as_fast_sequence(seq_lens, "seq_lens");
  const py::object extend_seq = as_fast_sequence(extend_lens, "extend_lens");
  const Py_ssize_t batch = PySequence_Fast_GET_SIZE(rows_seq.ptr());
  const std::pair<const char*, const py::object*> per_request[] = {
      {"prefix_tensors", &tensors_seq}, {"prefix_lens", &prefix_seq}, {"seq_lens", &seq_seq},
      {"extend_lens", &extend_seq}};
  for (const auto& [field, seq] : per_request) {
    TORCH_CHECK_VALUE(
        PySequence_Fast_GET_SIZE(seq->ptr()) == batch, kOp, ": ", field, " has ",
        PySequence_Fast_GET_SIZE(seq->ptr()), " entries but req_pool_indices has ", batch);
  }
  CacheIndexPlan plan;
  plan.rows_of = int64_values(rows_seq.ptr(), "req_pool_indices");
  plan.prefix_lens = int64_values(prefix_seq.ptr(), "prefix_lens");
  plan.seq_lens = int64_values(seq_seq.ptr(), "seq_lens");
  const std::vector<int64_t> extend = int64_values(extend_seq.ptr(), "extend_lens");
  const std::vector<int64_t>& prefix = plan.prefix_lens;
  const std::vector<int64_t>& seq = plan.seq_lens;
  PyObject** tensors = PySequence_Fast_ITEMS(tensors_seq.ptr());

  const int64_t rows = req_to_token.size(0);
  const int64_t max_context_len = req_to_token.size(1);
  plan.prefix_pointers.resize(static_cast<size_t>(batch));
  plan.out_cache_offsets.resize(static_cast<size_t>(batch));
  int64_t running = 0;
  for (Py_ssize_t i = 0; i < batch; ++i) {
    check_request_span(i, plan.rows_of[i], prefix[i], seq[i], rows, max_context_len);
    TORCH_CHECK_VALUE(
        extend[i] == seq[i] - prefix[i], kOp, ": request ", i, ": extend_lens (", extend[i],
        ") != seq_lens - prefix_lens (", seq[i], " - ", prefix[i], ")");

    PyObject* obj = tensors[i];
    TORCH_CHECK_TYPE(
        pinstage::is_tensor(obj), kOp, ": request ", i, ": prefix_tensors entry must be a tensor, got ",
        Py_TYPE(obj)->tp_name);
    const at::Tensor& cached = THPVariable_Unpack(obj);
    TORCH_CHECK_VALUE(
        cached.device() == device, kOp, ": request ", i, ": prefix_tensors entry is on ", cached.device(),
        " but req_to_token is on ", device);
    TORCH_CHECK_TYPE(
        cached.scalar_type() == at::kLong, kOp, ": request ", i, ": prefix_tensors entry must be int64, got ",
        cached.scalar_type());
    TORCH_CHECK_VALUE(
        cached.dim() == 1, kOp, ": request ", i, ": prefix_tensors entry must be 1-D, got shape ", cached.sizes());
    TORCH_CHECK_VALUE(
        cached.numel() >= prefix[i], kOp, ": request ", i, ": prefix_tensors entry has ", cached.numel(),
        " elements but prefix_lens is ", prefix[i]);
    TORCH_CHECK_VALUE(
        prefix[i] <= 1 || cached.stride(0) == 1, kOp, ": request ", i,
        ": prefix_tensors entry must be contiguous, got stride ", cached.stride(0));

    plan.prefix_pointers[i] = reinterpret_cast<uintptr_t>(cached.const_data_ptr());
    plan.out_cache_offsets[i] = running;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(running, extend[i], &running), kOp, ": extend_lens add up to more than 2**63");
  }
  TORCH_CHECK_VALUE(
      running == out_cache_loc.numel(), kOp, ": extend_lens add up to ", running, " but out_cache_loc has ",
      out_cache_loc.numel(), " elements");
  return plan;
}

// The plan's host-computed values as Python lists, for the "pinned" and "blocking" backends.
py::tuple cache_index_plan(
    const at::Tensor& req_to_token,
    const py::handle& req_pool_indices,
    const py::handle& prefix_tensors,
    const py::handle& prefix_lens,
    const py::handle& seq_lens,
    const py::handle& extend_lens,
    const at::Tensor& out_cache_loc) {
  const CacheIndexPlan plan = plan_cache_indices(
      req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc);
  return py::make_tuple(py::cast(plan.prefix_pointers), py::cast(plan.out_cache_offsets));
}

// The whole plan staged in one copy (backend="pinstage"): [req_pool_indices, prefix_lens, seq_lens,
// out_cache_offsets as int64, prefix_pointers as uint64], on req_to_token's device and `stream`.
std::vector<at::Tensor> stage_cache_index_plan(
    const at::Tensor& req_to_token,
    const py::handle& req_pool_indices,
    const py::handle& prefix_tensors,
    const py::handle& prefix_lens,
    const py::handle& seq_lens,
    const py::handle& extend_lens,
    const at::Tensor& out_cache_loc,
    const py::handle& stream) {
  const CacheIndexPlan plan = plan_cache_indices(
      req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc);
  const int64_t batch = static_cast<int64_t>(plan.rows_of.size());
  const std::vector<pinstage::HostArray> arrays{
      {plan.rows_of.data(), at::kLong, {batch}},
      {plan.prefix_lens.data(), at::kLong, {batch}},
      {plan.seq_lens.data(), at::kLong, {batch}},
      {plan.out_cache_offsets.data(), at::kLong, {batch}},
      {plan.prefix_pointers.data(), at::kUInt64, {batch}},
  };
  const py::object device = py::cast(req_to_token.device());
  const pinstage::Target target = pinstage::resolve_target(stream.ptr(), device.ptr());
  TORCH_CHECK_VALUE(
      target.cuda == req_to_token.is_cuda() && (!target.cuda || target.index == req_to_token.device().index()), kOp,
      ": stream is on another device than req_to_token (", req_to_token.device(), ")");
  return pinstage::stage_host_arrays(arrays, target, "pinstage::builders::cache_index_plan");
}

}  // namespace

void bind_cache_indices(py::module_& m) {
  m.def(
      "write_cache_indices", &write_cache_indices,
      "Fill req_to_token rows with each request's cached prefix and its slice of out_cache_loc "
      "(one kernel launch on CUDA; a loop on the CPU).",
      py::arg("req_to_token"), py::arg("req_pool_indices"), py::arg("prefix_pointers"), py::arg("prefix_lens"),
      py::arg("seq_lens"), py::arg("out_cache_offsets"), py::arg("out_cache_loc"), py::arg("stream") = py::none());
  m.def(
      "cache_index_plan", &cache_index_plan,
      "Validate a write_cache_indices batch on the host; return (prefix data pointers, out_cache_loc offsets).",
      py::arg("req_to_token"), py::arg("req_pool_indices"), py::arg("prefix_tensors"), py::arg("prefix_lens"),
      py::arg("seq_lens"), py::arg("extend_lens"), py::arg("out_cache_loc"));
  m.def(
      "_stage_cache_index_plan", &stage_cache_index_plan,
      "cache_index_plan, then its values and the request fields staged in one copy: [req_pool_indices, prefix_lens, "
      "seq_lens, out_cache_offsets, prefix_pointers].",
      py::arg("req_to_token"), py::arg("req_pool_indices"), py::arg("prefix_tensors"), py::arg("prefix_lens"),
      py::arg("seq_lens"), py::arg("extend_lens"), py::arg("out_cache_loc"), py::arg("stream"));
}

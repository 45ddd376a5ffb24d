// Decode inputs gathered from request objects: each request's last token (its last output token,
// or its last prompt token before it has any output), its sequence length and its req_to_token row.
#include "native_builders.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <vector>

#include "../scalar_store.h"
#include "../stage.h"
#include "../target.h"
#include "py_fields.h"

namespace py = pybind11;

namespace pinstage::builders {
namespace {

PyObject* output_ids_name() {
  PINSTAGE_ATTR_NAME(name, "output_ids");
  return name;
}
PyObject* prompt_ids_name() {
  PINSTAGE_ATTR_NAME(name, "origin_input_ids");
  return name;
}

enum class Gathered { kDone, kDeclined, kNeedsPython };

// The last item of a list or tuple as int64; false when it is neither, is empty, or its last item
// is not converted exactly as torch.tensor would (the caller declines).
bool store_last_item(PyObject* seq, int64_t* out) {
  Py_ssize_t n = 0;
  PyObject** items = nullptr;
  return as_list_or_tuple(seq, &n, &items) && n > 0 && store<int64_t>(items[n - 1], out);
}

// The last tokens of a batch whose fields all sit in instance dicts (plain objects and dataclasses):
// kNeedsPython as soon as one does not, before any getter can have run.
//
// One token per request is a chain of dependent loads (the request, its dict, the list, the list's
// items, the int); a request at a time, each load waits for the one before. So requests are taken in
// groups, one link of the chain across the group before the next, each link prefetching what the
// next one reads, and the loads of a group overlap. No getter runs here, but building an object's
// dict allocates, and an allocation may start a garbage collection whose finalizers run Python code:
// so requests and lists are held while dicts are read, and the steps that keep raw pointers into
// the lists (from the sizes to the stores) neither read dicts nor allocate.
constexpr int kGroup = 8;

Gathered last_tokens_from_dicts(PyObject* requests, Py_ssize_t bs, FieldReader& output_ids, FieldReader& prompt_ids,
                                int64_t* out) {
  Ref outputs[kGroup];
  PyObject** last[kGroup];
  for (Py_ssize_t base = 0; base < bs; base += kGroup) {
    const int g = static_cast<int>(std::min<Py_ssize_t>(kGroup, bs - base));
    for (int k = 0; k < g; ++k) {
      const Ref req = item_at(requests, bs, base + k);
      if (!req) return Gathered::kDeclined;
      outputs[k] = Ref::borrow(output_ids.peek(req.ptr()));
      if (!outputs[k]) return Gathered::kNeedsPython;
      __builtin_prefetch(outputs[k].ptr());
    }
    for (int k = 0; k < g; ++k) {
      Py_ssize_t n = 0;
      PyObject** items = nullptr;
      if (!as_list_or_tuple(outputs[k].ptr(), &n, &items)) return Gathered::kDeclined;
      last[k] = n > 0 ? &items[n - 1] : nullptr;  // null: the prompt's, below
      if (last[k] != nullptr) __builtin_prefetch(last[k]);
    }
    for (int k = 0; k < g; ++k) {
      if (last[k] != nullptr) __builtin_prefetch(*last[k]);
    }
    for (int k = 0; k < g; ++k) {
      if (last[k] != nullptr && !store<int64_t>(*last[k], &out[base + k])) return Gathered::kDeclined;
    }
    // `output_ids or origin_input_ids`: the prompt only where the output is empty.
    for (int k = 0; k < g; ++k) {
      if (last[k] != nullptr) continue;
      const Ref req = item_at(requests, bs, base + k);
      if (!req) return Gathered::kDeclined;
      const Ref prompt = Ref::borrow(prompt_ids.peek(req.ptr()));
      if (!prompt) return Gathered::kNeedsPython;
      if (!store_last_item(prompt.ptr(), &out[base + k])) return Gathered::kDeclined;
    }
  }
  return Gathered::kDone;
}

// The same, a request at a time in Python's order, for fields that property getters, __getattr__ or
// class defaults provide: those may run Python code, so every reference is held and every list
// read afresh after it.
Gathered last_tokens_one_by_one(PyObject* requests, Py_ssize_t bs, FieldReader& output_ids, FieldReader& prompt_ids,
                                int64_t* out) {
  for (Py_ssize_t i = 0; i < bs; ++i) {
    // Held: a getter below could drop it from the caller's list.
    const Ref req = item_at(requests, bs, i);
    if (!req) return Gathered::kDeclined;
    const Ref output = output_ids.read(req.ptr());
    Py_ssize_t n = 0;
    if (!output || !as_list_or_tuple(output.ptr(), &n)) return Gathered::kDeclined;
    // `output_ids or origin_input_ids`: the prompt is read only when the output is empty, as in
    // Python, which does not look at the output again afterwards.
    const Ref source = n > 0 ? Ref::borrow(output.ptr()) : prompt_ids.read(req.ptr());
    if (!source || !store_last_item(source.ptr(), &out[i])) return Gathered::kDeclined;
  }
  return Gathered::kDone;
}

}  // namespace

LastTokenPasses& last_token_passes() {
  static LastTokenPasses passes;
  return passes;
}

py::object stage_last_token_ids(py::handle requests, py::handle stream, py::handle device) {
  FieldReader output_ids(output_ids_name()), prompt_ids(prompt_ids_name());
  // First: it can run Python code (CUDA's lazy initialisation), and nothing is read yet.
  const Target target = resolve_target(stream.ptr(), device.ptr());
  Py_ssize_t bs = 0;
  if (!as_list_or_tuple(requests.ptr(), &bs)) return py::none();

  // A decline (no token, a value that is not an int in range, not a list) leaves it to the Python
  // builder, which stages what it can or raises naming the request.
  std::vector<int64_t> last_ids(static_cast<size_t>(bs));
  LastTokenPasses& passes = last_token_passes();
  Gathered result = last_tokens_from_dicts(requests.ptr(), bs, output_ids, prompt_ids, last_ids.data());
  if (result == Gathered::kDone) ++passes.grouped;
  if (result == Gathered::kNeedsPython) {
    result = last_tokens_one_by_one(requests.ptr(), bs, output_ids, prompt_ids, last_ids.data());
    if (result == Gathered::kDone) ++passes.one_by_one;
  }
  if (result != Gathered::kDone) return py::none();
  const std::vector<at::Tensor> staged =
      stage_host_arrays({{last_ids.data(), c10::kLong, {bs}}}, target, "pinstage::builders::last_token_ids");
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(staged[0]));
}

py::object stage_decode_inputs(py::handle requests, py::handle stream, py::handle device) {
  PINSTAGE_ATTR_NAME(kPoolRow, "req_pool_idx");
  FieldReader output_ids(output_ids_name()), prompt_ids(prompt_ids_name()), pool_row(kPoolRow);
  const Target target = resolve_target(stream.ptr(), device.ptr());
  Py_ssize_t bs = 0;
  if (!as_list_or_tuple(requests.ptr(), &bs)) return py::none();

  // One buffer for the three arrays: [last ids | seq lens | rows].
  std::vector<int64_t> values(3 * static_cast<size_t>(bs));
  int64_t* last_ids = values.data();
  int64_t* seq_lens = last_ids + bs;
  int64_t* rows = seq_lens + bs;
  for (Py_ssize_t i = 0; i < bs; ++i) {
    const Ref req = item_at(requests.ptr(), bs, i);
    if (!req) return py::none();
    const Ref output = output_ids.read(req.ptr());
    Py_ssize_t n_output = 0, n_prompt = 0;
    PyObject** output_items = nullptr;
    PyObject** prompt_items = nullptr;
    if (!output || !as_list_or_tuple(output.ptr(), &n_output, &output_items)) return py::none();
    const bool from_prompt = n_output == 0;
    const Ref prompt = prompt_ids.read(req.ptr());
    if (!prompt || !as_list_or_tuple(prompt.ptr(), &n_prompt, &prompt_items)) return py::none();
    // The prompt's getter may have run Python code that resized the output list: look again.
    as_list_or_tuple(output.ptr(), &n_output, &output_items);
    const Py_ssize_t n_from = from_prompt ? n_prompt : n_output;
    if (n_from == 0) return py::none();  // no token at all: the Python builder names the request
    PyObject* last = (from_prompt ? prompt_items : output_items)[n_from - 1];
    if (!store<int64_t>(last, &last_ids[i])) return py::none();
    seq_lens[i] = static_cast<int64_t>(n_prompt) + static_cast<int64_t>(n_output);
    const Ref row = pool_row.read(req.ptr());
    if (!row || !exact_int(row.ptr(), &rows[i]) || rows[i] < 0) return py::none();
  }
  return py::cast(stage_host_arrays(
      {{last_ids, c10::kLong, {bs}}, {seq_lens, c10::kLong, {bs}}, {rows, c10::kLong, {bs}}}, target,
      "pinstage::builders::decode_inputs"));
}

}  // namespace pinstage::builders

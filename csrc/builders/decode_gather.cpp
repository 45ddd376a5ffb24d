// Decode inputs gathered from request objects: each request's last token (its last output token,
// or its last prompt token before it has any output), its sequence length and its req_to_token row.
#include "native_builders.h"

#include <vector>

#include "../scalar_store.h"
#include "../stage.h"
#include "../target.h"
#include "py_fields.h"

namespace py = pybind11;

namespace pinstage::builders {

py::object stage_decode_inputs(py::handle requests, bool last_tokens_only, py::handle stream, py::handle device) {
  PINSTAGE_ATTR_NAME(kOutputIds, "output_ids");
  PINSTAGE_ATTR_NAME(kPromptIds, "origin_input_ids");
  PINSTAGE_ATTR_NAME(kPoolRow, "req_pool_idx");
  FieldReader output_ids(kOutputIds), prompt_ids(kPromptIds), pool_row(kPoolRow);

  // First: it can run Python code (CUDA's lazy initialisation), and nothing is read yet.
  const Target target = resolve_target(stream.ptr(), device.ptr());
  Py_ssize_t bs = 0;
  if (!as_list_or_tuple(requests.ptr(), &bs)) return py::none();  // items: read one by one, afresh (item_at)

  std::vector<int64_t> last_ids(static_cast<size_t>(bs));
  std::vector<int64_t> seq_lens(last_tokens_only ? 0 : static_cast<size_t>(bs));
  std::vector<int64_t> rows(last_tokens_only ? 0 : static_cast<size_t>(bs));
  for (Py_ssize_t i = 0; i < bs; ++i) {
    // Held: a property getter below runs Python code, which could drop it from the caller's list.
    const Ref req_ref = item_at(requests.ptr(), bs, i);
    if (!req_ref) return py::none();
    PyObject* req = req_ref.ptr();
    const Ref output = output_ids.read(req);
    Py_ssize_t n_output = 0, n_prompt = 0;
    PyObject** output_items = nullptr;
    PyObject** prompt_items = nullptr;
    if (!output || !as_list_or_tuple(output.ptr(), &n_output, &output_items)) return py::none();
    // `output_ids or origin_input_ids`: the prompt is read only when it is needed, as in Python.
    const bool from_prompt = n_output == 0;
    Ref prompt;
    if (from_prompt || !last_tokens_only) {
      prompt = prompt_ids.read(req);
      if (!prompt || !as_list_or_tuple(prompt.ptr(), &n_prompt, &prompt_items)) return py::none();
      // The prompt's getter may have run Python code that resized the output list: look again.
      as_list_or_tuple(output.ptr(), &n_output, &output_items);
    }
    const Py_ssize_t n_from = from_prompt ? n_prompt : n_output;
    if (n_from == 0) return py::none();  // no token at all: the Python builder names the request
    PyObject* last = (from_prompt ? prompt_items : output_items)[n_from - 1];
    if (!store<int64_t>(last, &last_ids[i])) return py::none();
    if (last_tokens_only) continue;
    seq_lens[i] = static_cast<int64_t>(n_prompt) + static_cast<int64_t>(n_output);
    const Ref row = pool_row.read(req);
    if (!row || !exact_int(row.ptr(), &rows[i]) || rows[i] < 0) return py::none();
  }

  std::vector<HostArray> arrays{{last_ids.data(), c10::kLong, {bs}}};
  if (!last_tokens_only) {
    arrays.push_back({seq_lens.data(), c10::kLong, {bs}});
    arrays.push_back({rows.data(), c10::kLong, {bs}});
  }
  return py::cast(stage_host_arrays(arrays, target, "pinstage::builders::decode_inputs"));
}

}  // namespace pinstage::builders

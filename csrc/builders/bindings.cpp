// The native builders' private entry points; pinstage/builders calls them for backend="pinstage".
//
// Plain METH_FASTCALL functions with positional arguments only: the builders call them every step,
// and pybind11's generic dispatch cost as much as gathering a few dozen requests.
#include "native_builders.h"

#include "../fastcall.h"

namespace py = pybind11;

namespace pinstage::builders {
namespace {

bool truth(PyObject* obj) {
  const int t = PyObject_IsTrue(obj);
  if (t < 0) throw py::error_already_set();
  return t == 1;
}

int64_t as_int64(PyObject* obj) {
  const long long v = PyLong_AsLongLong(obj);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

py::object last_token_ids(PyObject* const* a) { return stage_last_token_ids(a[0], a[1], a[2]); }
py::object decode_inputs(PyObject* const* a) { return stage_decode_inputs(a[0], a[1], a[2]); }
py::object sampling_batch(PyObject* const* a) {
  return stage_sampling_batch(a[0], truth(a[1]), as_int64(a[2]), as_int64(a[3]), a[4], a[5]);
}

py::object last_token_passes_counts(PyObject* const*) {
  const LastTokenPasses& p = last_token_passes();
  return py::make_tuple(p.grouped, p.one_by_one);
}

constexpr char kLastTokenIds[] = "_stage_last_token_ids";
constexpr char kDecodeInputs[] = "_stage_decode_inputs";
constexpr char kSamplingBatch[] = "_stage_sampling_batch";
constexpr char kPassCounts[] = "_last_token_pass_counts";

// `Body` with exactly `N` positional arguments, its C++ exceptions set as Python errors.
template <py::object (*Body)(PyObject* const*), Py_ssize_t N, const char* Name>
PyObject* entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != N) {
    PyErr_Format(PyExc_TypeError, "pinstage._C.%s() takes %zd positional arguments (%zd given)", Name, N, nargs);
    return nullptr;
  }
  try {
    return Body(args).release().ptr();
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
}

template <py::object (*Body)(PyObject* const*), Py_ssize_t N, const char* Name>
PyMethodDef method(const char* doc) {
  return {Name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&entry<Body, N, Name>)), METH_FASTCALL,
          doc};
}

PyMethodDef kBuilderMethods[] = {
    method<last_token_ids, 3, kLastTokenIds>("_stage_last_token_ids(requests, stream, device) -> Tensor | None"),
    method<decode_inputs, 3, kDecodeInputs>(
        "_stage_decode_inputs(requests, stream, device) -> [input_ids, seq_lens, req_pool_indices] | None"),
    method<sampling_batch, 6, kSamplingBatch>(
        "_stage_sampling_batch(params, with_seeds, top_k_all, default_seed, stream, device) -> tuple | None"),
    method<last_token_passes_counts, 0, kPassCounts>(
        "_last_token_pass_counts() -> (grouped, one_by_one): batches _stage_last_token_ids finished with each "
        "pass (for tests)"),
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bind_native_builders(py::module_& m) {
  if (PyModule_AddFunctions(m.ptr(), kBuilderMethods) != 0) throw py::error_already_set();
}

}  // namespace pinstage::builders

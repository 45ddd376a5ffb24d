// pinstage._C: the compiled core's Python surface, the one file that uses pybind11.
// Users import pinstage, never this module: pinstage/_api.py exports the staging and fetch functions
// and the fetch handle as they are (their docstrings are docs.h) and wraps the rest.
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/docs.h"
#include "bindings/errors.h"
#include "bindings/fast_args.h"
#include "convert/buffer_source.h"
#include "convert/item_plan.h"
#include "convert/scalar_store.h"
#include "copy/fetch.h"
#include "copy/target.h"
#include "ops/logprob_indices.h"
#include "ops/stage_prefill.h"
#include "ops/write_cache_indices.h"
#include "python/error_prefix.h"
#include "python/py_objects.h"
#include "ring/device_stats.h"
#include "ring/options.h"
#include "ring/registry.h"
#include "tensor/stage.h"
#include "tensor/static_inputs.h"

namespace py = pybind11;

namespace pinstage {
namespace {

PyObject* g_ring_full_error = nullptr;

// stats(): DeviceStats as a dict, its keys pinstage/_api.py's Stats.
py::dict stats(py::handle device_arg) {
  const DeviceStats s = device_stats(resolve_device(device_arg.ptr()));
  py::dict out;
  out["device"] = py::str(s.device.str());
  out["ring_allocated"] = py::bool_(s.ring_allocated);
  out["on_full"] = py::str(on_full_name(s.on_full));
#define PINSTAGE_STAT_ITEM(name) out[#name] = py::int_(s.name);
  PINSTAGE_STAT_COUNTERS(PINSTAGE_STAT_ITEM)
#undef PINSTAGE_STAT_ITEM
  return out;
}

// ring_bytes: an int, at least kMinRingBytes (configure_rings checks that). A string is refused,
// naming the int it would mean: PINSTAGE_RING_BYTES takes "16M", the Python API takes 16 << 20.
std::optional<size_t> ring_bytes_arg(py::handle value) {
  if (value.is_none()) return std::nullopt;
  if (PyUnicode_Check(value.ptr())) {
    std::string hint;
    if (const char* text = PyUnicode_AsUTF8(value.ptr())) {
      try {
        hint = "; pass the int " + std::to_string(parse_byte_count(text, "ring_bytes"));
      } catch (const c10::Error&) {
      }
    }
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, "pinstage.configure: ring_bytes must be an int (bytes), got str ",
                     py::repr(value).cast<std::string>(), hint,
                     " (the environment variable PINSTAGE_RING_BYTES takes byte counts such as \"16M\")");
  }
  TORCH_CHECK_TYPE(PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr()),
                   "pinstage.configure: ring_bytes must be an int (bytes), got ", Py_TYPE(value.ptr())->tp_name);
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow > 0) {
    PyErr_Format(PyExc_OverflowError, "pinstage.configure: ring_bytes=%R is too large", value.ptr());
    throw py::error_already_set();
  }
  TORCH_CHECK_VALUE(overflow == 0 && n > 0, "pinstage.configure: ring_bytes must be positive, got ",
                    py::repr(value).cast<std::string>());
  return static_cast<size_t>(n);
}

void configure(py::handle ring_bytes, py::handle on_full, py::handle device) {
  const std::optional<size_t> bytes = ring_bytes_arg(ring_bytes);
  std::optional<OnFull> mode;
  if (!on_full.is_none()) {
    TORCH_CHECK_TYPE(PyUnicode_Check(on_full.ptr()), "pinstage.configure: on_full must be a str, got ",
                     Py_TYPE(on_full.ptr())->tp_name);
    const char* text = PyUnicode_AsUTF8(on_full.ptr());
    if (text == nullptr) {
      PyErr_Clear();
      TORCH_CHECK_VALUE(false, "pinstage.configure: on_full must be \"overflow\", \"wait\" or \"error\"");
    }
    mode = parse_on_full(text);
  }
  std::optional<c10::DeviceIndex> index;
  if (!device.is_none()) {
    const c10::Device d = resolve_device(device.ptr());
    TORCH_CHECK_VALUE(d.is_cuda(), "pinstage.configure: the CPU has no ring");
    index = d.index();
  }
  configure_rings(bytes, mode, index);
}

// The calls engines make every step, as METH_FASTCALL functions that pinstage exports as they
// are (fast_args.h says why).
template <size_t N, const FastSignature<N>& Sig, PyObject* (*Body)(const std::array<PyObject*, N>&)>
PyObject* fast_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  // Owned outside the error scope: a buffered warning raised as an error when that scope ends
  // makes the call fail after the result exists, and the result must then be released.
  THPObjectPtr result;
  HANDLE_TH_ERRORS
  std::array<PyObject*, N> a{};
  if (!parse_fast_args(Sig, args, nargs, kwnames, a)) return nullptr;
  result = translate_core_errors([&] { return Body(a); });
  END_HANDLE_TH_ERRORS
  return result.release();
}

constexpr FastSignature<4> kStageToDevice{"stage_to_device", {"data", "dtype", "stream", "device"}, 2, 3};
PyObject* stage_to_device_body(const std::array<PyObject*, 4>& a) {
  return wrap_tensor(stage_to_device(a[0], a[1], a[2], a[3]));
}

constexpr FastSignature<3> kStageMany{"stage_many", {"items", "stream", "device"}, 1, 2};
PyObject* stage_many_body(const std::array<PyObject*, 3>& a) {
  std::vector<at::Tensor> tensors = stage_many(a[0], a[1], a[2]);
  THPObjectPtr list(checked(PyList_New(static_cast<Py_ssize_t>(tensors.size()))));
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), checked(wrap_tensor(std::move(tensors[i]))));
  }
  return list.release();
}

constexpr FastSignature<3> kStageInto{"stage_into", {"data", "out", "stream"}, 2, 3};
PyObject* stage_into_body(const std::array<PyObject*, 3>& a) {
  stage_into(a[0], a[1], a[2]);
  return Py_NewRef(a[1]);
}

// StaticInputs.stage's core (pinstage/_static_inputs.py calls it with the pybind11 object).
constexpr FastSignature<4> kStaticStage{"_static_inputs_stage", {"inputs", "values", "n", "stream"}, 4, 4};
PyObject* static_stage_body(const std::array<PyObject*, 4>& a) {
  // One type check, by the caster itself: None and other types are refused, without pybind11's
  // message-less cast_error.
  py::detail::make_caster<StaticInputs> inputs;
  TORCH_CHECK_TYPE(inputs.load(a[0], /*convert=*/false),
                   "_static_inputs_stage: inputs must be a pinstage._C.StaticInputs, got ", Py_TYPE(a[0])->tp_name);
  py::detail::cast_op<StaticInputs&>(inputs).stage(a[1], a[2], a[3]);
  Py_RETURN_NONE;
}

// A per-request column of the builders' compiled calls given as a list: its Python ints, read with
// no Python code running (so the list cannot change meanwhile); nothing where it is not a list or
// an entry is another kind of int or beyond int64 (the builder's checked path then names it).
std::optional<std::vector<int64_t>> int64_list(PyObject* column) {
  if (!PyList_CheckExact(column)) return std::nullopt;
  const Py_ssize_t n = PyList_GET_SIZE(column);
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(column, i);
    long long value = 0;
    if (!PyLong_CheckExact(item) || !exact_int_value(item, &value)) return std::nullopt;
    values[static_cast<size_t>(i)] = value;
  }
  return values;
}

// write_cache_indices' prefix_tensors (a sequence of tensors), read into a tuple first (the
// caller's list could change meanwhile in another thread); the tensors are borrowed from the
// tuple's objects, which `tuple` keeps alive.
struct PrefixTensors {
  THPObjectPtr tuple;
  std::vector<const at::Tensor*> tensors;
};
PrefixTensors prefix_tensor_list(PyObject* prefix_tensors) {
  PrefixTensors out{THPObjectPtr(checked(PySequence_Tuple(prefix_tensors))), {}};
  const Py_ssize_t n = PyTuple_GET_SIZE(out.tuple.get());
  out.tensors.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(out.tuple.get(), i);
    TORCH_CHECK_TYPE(is_tensor(item), "write_cache_indices: request ", i,
                     ": prefix_tensors entry must be a tensor, got ", Py_TYPE(item)->tp_name);
    out.tensors.push_back(&unpack_tensor(item));
  }
  return out;
}

// pinstage.builders.stage_prefill's call, all arguments given (None for no cache rows). Returns
// None, having done nothing, where a per-request column is not a list of Python ints that int64
// holds: the builder's checked path then names the entry.
constexpr FastSignature<11> kStagePrefill{
    "_stage_prefill",
    {"items", "extend_lens", "logprob_starts", "req_to_token", "req_pool_indices", "prefix_tensors", "prefix_lens",
     "seq_lens", "out_cache_loc", "stream", "device"},
    11,
    11};
PyObject* stage_prefill_body(const std::array<PyObject*, 11>& a) {
  std::optional<std::vector<int64_t>> lens = int64_list(a[1]);
  std::optional<std::vector<int64_t>> starts = int64_list(a[2]);
  if (!lens || !starts) Py_RETURN_NONE;
  std::optional<PrefillCacheRows> cache;
  PrefixTensors prefixes;  // held until the call returns: its tuple keeps the borrowed tensors alive
  if (a[3] != Py_None) {
    TORCH_CHECK_TYPE(is_tensor(a[3]), "pinstage.builders.stage_prefill: req_to_token must be a tensor, got ",
                     Py_TYPE(a[3])->tp_name);
    std::optional<std::vector<int64_t>> rows = int64_list(a[4]);
    std::optional<std::vector<int64_t>> prefix_lens = int64_list(a[6]);
    std::optional<std::vector<int64_t>> seq_lens = int64_list(a[7]);
    if (!rows || !prefix_lens || !seq_lens) Py_RETURN_NONE;
    prefixes = prefix_tensor_list(a[5]);
    TORCH_CHECK_TYPE(PyLong_CheckExact(a[8]),
                     "pinstage.builders.stage_prefill: out_cache_loc must be the index of "
                     "an item (an int), got ",
                     Py_TYPE(a[8])->tp_name);
    const long long item = PyLong_AsLongLong(a[8]);
    if (item == -1 && PyErr_Occurred()) throw PythonError();
    cache.emplace(
        PrefillCacheRows{&unpack_tensor(a[3]), std::move(prefixes.tensors),
                         RequestValues{std::move(*rows), std::move(*prefix_lens), std::move(*seq_lens), {}, {}},
                         static_cast<int64_t>(item)});
  }
  std::vector<at::Tensor> tensors = stage_prefill(a[0], std::move(*lens), *starts, std::move(cache), a[9], a[10]);
  THPObjectPtr list(checked(PyList_New(static_cast<Py_ssize_t>(tensors.size()))));
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), checked(wrap_tensor(std::move(tensors[i]))));
  }
  return list.release();
}

template <size_t N, const FastSignature<N>& Sig, PyObject* (*Body)(const std::array<PyObject*, N>&)>
PyMethodDef fast_method(const char* doc) {
  return {Sig.name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&fast_entry<N, Sig, Body>)),
          METH_FASTCALL | METH_KEYWORDS, doc};
}

// The builders' test of a column before they hand it to the converter: one pass in C, where
// Python's set(map(type, values)) took about 11 us per 1024 entries. No Python code runs in the
// loop, so the list cannot change under it.
PyObject* is_plain_int_list(PyObject* /*module*/, PyObject* values) {
  if (!PyList_CheckExact(values)) Py_RETURN_FALSE;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); ++i) {
    if (!PyLong_CheckExact(PyList_GET_ITEM(values, i))) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// fetch_many's tensors: a tuple copy (checking an item runs no Python code, but the caller's list
// could change meanwhile in another thread); an error names the item.
std::vector<at::Tensor> fetch_many_tensors(PyObject* tensors) {
  THPObjectPtr items(checked(PySequence_Tuple(tensors)));
  std::vector<at::Tensor> out;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.get()); ++i) {
    PyObject* item = PyTuple_GET_ITEM(items.get(), i);
    TORCH_CHECK_TYPE(is_tensor(item), "pinstage.fetch_many: item ", i, " must be a torch.Tensor, got ",
                     Py_TYPE(item)->tp_name);
    out.push_back(unpack_tensor(item));
  }
  return out;
}

PyObject* wrap_fetch(std::shared_ptr<FetchHandle> handle) { return py::cast(std::move(handle)).release().ptr(); }

constexpr FastSignature<2> kFetchToHost{"fetch_to_host", {"tensor", "stream"}, 1, 2};
PyObject* fetch_to_host_body(const std::array<PyObject*, 2>& a) {
  TORCH_CHECK_TYPE(is_tensor(a[0]), "pinstage.fetch_to_host: tensor must be a torch.Tensor, got ",
                   Py_TYPE(a[0])->tp_name);
  return wrap_fetch(FetchHandle::start({unpack_tensor(a[0])}, a[1], /*many=*/false));
}

constexpr FastSignature<2> kFetchMany{"fetch_many", {"tensors", "stream"}, 1, 2};
PyObject* fetch_many_body(const std::array<PyObject*, 2>& a) {
  return wrap_fetch(FetchHandle::start(fetch_many_tensors(a[0]), a[1], /*many=*/true));
}

// Waits for the handle's copy with the GIL released, only when it has not completed: a completed
// handle's wait costs no GIL hand-over.
void wait_without_gil(FetchHandle& h) {
  if (h.ready()) return;
  py::gil_scoped_release no_gil;
  h.wait();
}

// The handle's CPU tensors, after its copy.
std::vector<at::Tensor> fetched_tensors(FetchHandle& h) {
  wait_without_gil(h);
  return h.tensors();
}

// A handle's values, each as `read` makes it of its CPU tensor (numpy(), tolist()); one for
// fetch_to_host's handle, a list for fetch_many's.
py::object read_fetched(FetchHandle& h, const char* read) {
  std::vector<at::Tensor> tensors = fetched_tensors(h);
  py::list values;
  for (const at::Tensor& t : tensors) values.append(py::cast(t).attr(read)());
  return h.many() ? py::object(values) : values[0];
}

PyMethodDef kFastMethods[] = {
    fast_method<4, kStageToDevice, stage_to_device_body>(kStageToDeviceDoc),
    fast_method<3, kStageMany, stage_many_body>(kStageManyDoc),
    fast_method<3, kStageInto, stage_into_body>(kStageIntoDoc),
    fast_method<4, kStaticStage, static_stage_body>(kStaticInputsStageDoc),
    fast_method<2, kFetchToHost, fetch_to_host_body>(kFetchToHostDoc),
    fast_method<2, kFetchMany, fetch_many_body>(kFetchManyDoc),
    fast_method<11, kStagePrefill, stage_prefill_body>(kStagePrefillDoc),
    {"is_plain_int_list", &is_plain_int_list, METH_O,
     "is_plain_int_list(values): whether values is a list of Python ints (no bool or other int subclass)."},
};

// (name, dtype, row shape, fill as a 0-d CPU tensor, persistent) per field, as pinstage.StaticInputs
// passes them.
std::vector<StaticFieldSpec> static_field_specs(py::handle fields) {
  std::vector<StaticFieldSpec> specs;
  for (py::handle item : fields) {
    auto spec = item.cast<py::tuple>();
    specs.push_back({spec[0].cast<std::string>(), parse_dtype(spec[1].ptr(), "Field dtype"),
                     spec[2].cast<std::vector<int64_t>>(), spec[3].cast<at::Tensor>(), spec[4].cast<bool>()});
  }
  return specs;
}

}  // namespace

PyObject* ring_full_error_type() { return g_ring_full_error; }

void add_ring_full_error(py::module_& m) {
  g_ring_full_error = PyErr_NewExceptionWithDoc(
      "pinstage.RingFullError",
      "The ring had no room and on_full=\"error\" (a RuntimeError): raise ring_bytes or use on_full=\"overflow\".",
      PyExc_RuntimeError, nullptr);
  if (g_ring_full_error == nullptr) throw py::error_already_set();
  m.add_object("RingFullError", py::reinterpret_borrow<py::object>(g_ring_full_error));
}

}  // namespace pinstage

PYBIND11_MODULE(_C, m) {
  using namespace pinstage;
  m.doc() = "pinstage's compiled core; import pinstage instead.";
  add_ring_full_error(m);

  for (PyMethodDef& def : kFastMethods) {
    m.add_object(def.ml_name,
                 py::reinterpret_steal<py::object>(PyCFunction_NewEx(&def, nullptr, py::str("pinstage._C").ptr())));
  }
  m.def("stats", [](py::handle device) { return translate_errors([&] { return stats(device); }); });
  m.def("configure", [](py::handle ring_bytes, py::handle on_full, py::handle device) {
    translate_errors([&] { configure(ring_bytes, on_full, device); });
  });
  m.def("empty_cache", [](py::handle device) {
    translate_errors([&] {
      if (device.is_none()) return free_unused_ring_memory(std::nullopt);
      const c10::Device d = resolve_device(device.ptr());
      if (d.is_cuda()) free_unused_ring_memory(d.index());
    });
  });
  // Whether this build stages to CUDA devices at all: a constant, so that an engine's plugin can
  // decide without a CUDA call (cudaGetDeviceCount initialises the driver, which a fork then inherits).
#ifdef PINSTAGE_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  // stage_prefill on a device: the most bytes of items its launch copies itself (above: the copy engine).
  m.attr("PREFILL_BLOCKS_COPY_MAX_BYTES") = kBlocksCopyMaxBytes;
  m.def("target_device", [](py::handle stream, py::handle device) {
    return translate_errors([&] { return resolve_target(stream.ptr(), device.ptr()).device; });
  });

  py::class_<FetchHandle, std::shared_ptr<FetchHandle>>(m, "FetchHandle", kFetchHandleDoc)
      .def(
          "ready", [](FetchHandle& h) { return translate_errors([&] { return h.ready(); }); }, kFetchReadyDoc)
      .def(
          "wait",
          [](py::object self) {
            translate_errors([&] { wait_without_gil(self.cast<FetchHandle&>()); });
            return self;
          },
          kFetchWaitDoc)
      .def(
          "tensors", [](FetchHandle& h) { return translate_errors([&] { return fetched_tensors(h); }); },
          kFetchTensorsDoc)
      .def(
          "tensor",
          [](FetchHandle& h) {
            return translate_errors([&] {
              TORCH_CHECK_TYPE(!h.many(),
                               "pinstage.FetchHandle.tensor: this handle holds several tensors; use tensors()");
              return fetched_tensors(h)[0];
            });
          },
          kFetchTensorDoc)
      .def(
          "numpy", [](FetchHandle& h) { return translate_errors([&] { return read_fetched(h, "numpy"); }); },
          kFetchNumpyDoc)
      .def(
          "tolist", [](FetchHandle& h) { return translate_errors([&] { return read_fetched(h, "tolist"); }); },
          kFetchTolistDoc)
      .def("release", &FetchHandle::release, kFetchReleaseDoc)
      .def_property_readonly("released", &FetchHandle::released)
      .def("__len__", &FetchHandle::count)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](FetchHandle& h, py::args) { h.release(); })
      .def("__repr__", [](FetchHandle& h) {
        const char* state =
            h.released() ? "released" : (translate_errors([&] { return h.ready(); }) ? "ready" : "in flight");
        return "<pinstage.FetchHandle of " + std::to_string(h.count()) + " tensor(s), " + state + ">";
      });
  // The logits processor's index tensors (pinstage/builders/logits.py): each column converted by
  // pinstage's converter into memory of the call's own, no torch op in between.
  m.def("logprob_indices", [](py::handle lens, py::handle starts) {
    return translate_errors([&] {
      auto column = [](py::handle values) {
        ItemPlan plan = plan_item(values.ptr(), at::kLong);
        TORCH_CHECK_VALUE(plan.shape.size() == 1, "logprob_indices: each column must be one int per request");
        return cpu_values(plan);
      };
      const at::Tensor len = column(lens);
      const at::Tensor start = column(starts);
      // The values are the call's own: other Python threads may run while the indices are computed.
      GilReleasedIfHeld no_gil;
      return logprob_indices(c10::ArrayRef<int64_t>(len.const_data_ptr<int64_t>(), len.numel()),
                             c10::ArrayRef<int64_t>(start.const_data_ptr<int64_t>(), start.numel()));
    });
  });
  // pinstage.builders.write_cache_indices's call of the op's kernel, without torch's dispatcher. The
  // four per-request columns are all lists or all tensors. Lists are converted straight into the
  // op's own memory (int64_list); where one holds anything but Python ints that int64 holds, nothing
  // is done and the call returns False, for the builder's checked path to name the entry, which
  // passes tensors. The op checks the rest.
  m.def("write_cache_indices", [](const at::Tensor& req_to_token, py::handle req_pool_indices,
                                  py::handle prefix_tensors, py::handle prefix_lens, py::handle seq_lens,
                                  const at::Tensor& out_cache_loc, py::handle extend_lens) {
    return translate_errors([&] {
      const std::array<py::handle, 4> given = {req_pool_indices, prefix_lens, seq_lens, extend_lens};
      const std::array<const char*, 4> names = {"req_pool_indices", "prefix_lens", "seq_lens", "extend_lens"};
      const bool lists = PyList_CheckExact(given[0].ptr());
      for (size_t c = 0; c < 4; ++c) {
        const bool list = PyList_CheckExact(given[c].ptr());
        TORCH_CHECK_TYPE(list || is_tensor(given[c].ptr()), "write_cache_indices: ", names[c],
                         " must be a list or a tensor here, got ", Py_TYPE(given[c].ptr())->tp_name);
        TORCH_CHECK_TYPE(list == lists,
                         "write_cache_indices: the per-request columns must be all lists or all tensors here; ",
                         names[c], " is ", Py_TYPE(given[c].ptr())->tp_name);
      }
      RequestValues values;
      if (lists) {
        std::vector<int64_t>* into[4] = {&values.rows, &values.prefix_lens, &values.seq_lens, &values.extend_lens};
        for (size_t c = 0; c < 4; ++c) {
          std::optional<std::vector<int64_t>> column = int64_list(given[c].ptr());
          if (!column) return false;
          *into[c] = std::move(*column);
        }
      }
      const PrefixTensors prefixes = prefix_tensor_list(prefix_tensors.ptr());
      std::array<at::Tensor, 4> tensors;
      for (size_t c = 0; c < 4 && !lists; ++c) tensors[c] = unpack_tensor(given[c].ptr());
      // As torch releases it for an op. The tensors are borrowed from objects `prefixes` and the
      // caller keep alive; as for any op, another thread must not resize, set_ or swap them meanwhile.
      GilReleasedIfHeld no_gil;
      if (lists) {
        write_cache_indices_of_lists(req_to_token, prefixes.tensors, out_cache_loc, std::move(values));
      } else {
        write_cache_indices(req_to_token, tensors[0], prefixes.tensors, tensors[1], tensors[2], std::nullopt,
                            out_cache_loc, tensors[3]);
      }
      return true;
    });
  });
  py::class_<StaticInputs>(m, "StaticInputs")
      .def(py::init([](py::handle fields, int64_t max_bs, py::handle device) {
        return translate_errors(
            [&] { return std::make_unique<StaticInputs>(static_field_specs(fields), max_bs, device.ptr()); });
      }))
      .def("write_rows",
           [](StaticInputs& s, py::handle name, py::handle rows, py::handle starts, py::handle values) {
             translate_errors([&] { s.write_rows(name.ptr(), rows.ptr(), starts.ptr(), values.ptr()); });
           })
      .def_property_readonly("pending_writes", &StaticInputs::pending_writes)
      .def("views", &StaticInputs::views)
      .def_property_readonly("device", &StaticInputs::device);

  m.def("_check_dtype", [](py::handle dtype, const std::string& what) {
    translate_errors([&] { parse_dtype(dtype.ptr(), what.c_str()); });
  });
  m.def("_set_fallback", [](py::handle fn) { set_fallback(fn.ptr()); });
  m.def("_set_remade", [](py::handle fn) { set_remade(fn.ptr()); });
  m.def("_register_buffer_types", [](py::handle ndarray, py::handle generic, py::handle array) {
    register_buffer_types(ndarray.ptr(), generic.ptr(), array.ptr());
  });
}

// pinstage._C: the compiled core's Python surface, the one file that uses pybind11.
// pinstage/_api.py gives it signatures and docstrings; users import pinstage, never this module.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "values/buffer_source.h"
#include "convert/item_plan.h"
#include "python/errors.h"
#include "ring/options.h"
#include "ring/registry.h"
#include "copy/fetch.h"
#include "tensor/stage.h"
#include "tensor/static_inputs.h"
#include "values/target.h"
#include "values/py_objects.h"

namespace py = pybind11;

namespace pinstage {
namespace {

PyObject* g_ring_full_error = nullptr;

// stats(): the same keys for the CPU and for a CUDA device (rings then report zeros on the CPU).
py::dict stats(py::handle device_arg) {
  const c10::Device device = resolve_device(device_arg.ptr());
  struct Row {
    const char* key;
    py::object value;
  };
  uint64_t calls = 0, bytes = 0, copies = 0, fallbacks = 0, fetches = 0, fetch_bytes = 0;
  size_t ring_bytes = 0, in_flight = 0, peak = 0, pending = 0, ov_reserved = 0, ov_peak = 0, ov_in_flight = 0;
  size_t fetch_in_flight = 0;
  uint64_t overflows = 0, waits = 0, wraps = 0, events = 0, fetch_overflows = 0;
  bool allocated = false;
  OnFull on_full = default_on_full();
  if (device.is_cpu()) {
    const StagingCounters& c = cpu_counters();
    calls = c.calls, bytes = c.bytes, fallbacks = c.fallbacks;
  } else {
#ifdef PINSTAGE_WITH_CUDA
    StagingRing& ring = ring_for(device.index(), Direction::kToDevice);
    StagingRing& fetch_ring = ring_for(device.index(), Direction::kToHost);
    const auto s = ring.snapshot();
    const auto f = fetch_ring.snapshot();
    const StagingCounters& c = ring.counters();
    const StagingCounters& fc = fetch_ring.counters();
    calls = c.calls, bytes = c.bytes, copies = c.copies, fallbacks = c.fallbacks;
    ring_bytes = s.ring_bytes, allocated = s.allocated, in_flight = s.in_flight_bytes, peak = s.peak_in_flight_bytes;
    pending = s.pending_regions, overflows = s.overflows, waits = s.waits, wraps = s.wraps;
    events = s.events_created + f.events_created;
    ov_reserved = s.overflow_reserved_bytes + f.overflow_reserved_bytes;
    ov_peak = s.overflow_peak_reserved_bytes + f.overflow_peak_reserved_bytes;
    ov_in_flight = s.overflow_in_flight_bytes;
    fetches = fc.calls, fetch_bytes = fc.bytes, fetch_in_flight = f.in_flight_bytes + f.overflow_in_flight_bytes;
    fetch_overflows = f.overflows;
    on_full = ring.on_full();
#endif
  }
  const Row rows[] = {
      {"device", py::str(device.str())},
      {"ring_bytes", py::int_(ring_bytes)},
      {"ring_allocated", py::bool_(allocated)},
      {"on_full", py::str(on_full_name(on_full))},
      {"calls", py::int_(calls)},
      {"bytes_staged", py::int_(bytes)},
      {"copies", py::int_(copies)},
      {"fallbacks", py::int_(fallbacks)},
      {"in_flight_bytes", py::int_(in_flight)},
      {"peak_in_flight_bytes", py::int_(peak)},
      {"pending_regions", py::int_(pending)},
      {"overflows", py::int_(overflows)},
      {"waits", py::int_(waits)},
      {"wraps", py::int_(wraps)},
      {"events_created", py::int_(events)},
      {"overflow_reserved_bytes", py::int_(ov_reserved)},
      {"overflow_peak_reserved_bytes", py::int_(ov_peak)},
      {"overflow_in_flight_bytes", py::int_(ov_in_flight)},
      {"fetches", py::int_(fetches)},
      {"fetch_bytes", py::int_(fetch_bytes)},
      {"fetch_in_flight_bytes", py::int_(fetch_in_flight)},
      {"fetch_overflows", py::int_(fetch_overflows)},
  };
  py::dict out;
  for (const Row& r : rows) out[r.key] = r.value;
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

// stage_to_device as a plain METH_FASTCALL function of four positional arguments (data, dtype,
// stream, device): it is the call engines make most, and pybind11's dispatcher adds about 0.4 us
// to it (measured against this entry on a CPU build, where a call of one value takes ~0.7 us).
PyObject* stage_to_device_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "pinstage._C.stage_to_device takes 4 positional arguments (%zd given)", nargs);
    return nullptr;
  }
  return translate_core_errors([&] { return wrap_tensor(stage_to_device(args[0], args[1], args[2], args[3])); });
  END_HANDLE_TH_ERRORS
}

PyMethodDef kStageToDevice = {
    "stage_to_device", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&stage_to_device_entry)),
    METH_FASTCALL, "stage_to_device(data, dtype, stream, device): see pinstage.stage_to_device"};

std::vector<at::Tensor> tensors_arg(py::handle tensors, const char* api) {
  // A tuple copy: checking an item runs no Python code, but the caller's list could change meanwhile
  // in another thread.
  py::tuple items = py::tuple(py::reinterpret_borrow<py::object>(tensors));
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < items.size(); ++i) {
    TORCH_CHECK_TYPE(is_tensor(items[i].ptr()), "pinstage.", api, ": item ", i, " must be a torch.Tensor, got ",
                     Py_TYPE(items[i].ptr())->tp_name);
    out.push_back(unpack_tensor(items[i].ptr()));
  }
  return out;
}

// (name, dtype, row shape, fill as a 0-d CPU tensor) per field, as pinstage.StaticInputs passes them.
std::vector<StaticFieldSpec> static_field_specs(py::handle fields) {
  std::vector<StaticFieldSpec> specs;
  for (py::handle item : fields) {
    auto spec = item.cast<py::tuple>();
    specs.push_back({spec[0].cast<std::string>(), parse_dtype(spec[1].ptr(), "Field dtype"),
                     spec[2].cast<std::vector<int64_t>>(), spec[3].cast<at::Tensor>()});
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

  m.add_object("stage_to_device", py::reinterpret_steal<py::object>(
                                      PyCFunction_NewEx(&kStageToDevice, nullptr, py::str("pinstage._C").ptr())));
  m.def("stage_many", [](py::handle items, py::handle stream, py::handle device) {
    return translate_errors([&] { return stage_many(items.ptr(), stream.ptr(), device.ptr()); });
  });
  m.def("stage_into", [](py::handle data, py::handle out, py::handle stream) {
    translate_errors([&] { stage_into(data.ptr(), out.ptr(), stream.ptr()); });
    return py::reinterpret_borrow<py::object>(out);
  });
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
  m.def("target_device", [](py::handle stream, py::handle device) {
    return translate_errors([&] { return resolve_target(stream.ptr(), device.ptr()).device; });
  });

  py::class_<PendingFetch, std::shared_ptr<PendingFetch>>(m, "PendingFetch")
      .def("ready", [](PendingFetch& h) { return translate_errors([&] { return h.ready(); }); })
      .def("wait", [](PendingFetch& h) {
        translate_errors([&] {
          py::gil_scoped_release no_gil;
          h.wait();
        });
      })
      .def("tensors", [](PendingFetch& h) {
        return translate_errors([&] {
          if (!h.ready()) {
            py::gil_scoped_release no_gil;
            h.wait();
          }
          return h.tensors();
        });
      })
      .def("release", &PendingFetch::release)
      .def_property_readonly("released", &PendingFetch::released)
      .def("__len__", &PendingFetch::count);
  m.def("fetch", [](py::handle tensors, py::handle stream) {
    return translate_errors([&] { return PendingFetch::start(tensors_arg(tensors, "fetch_many"), stream.ptr(), "fetch"); });
  });

  py::class_<StaticInputs>(m, "StaticInputs")
      .def(py::init([](py::handle fields, int64_t max_bs, py::handle device) {
        return translate_errors([&] { return std::make_unique<StaticInputs>(static_field_specs(fields), max_bs, device.ptr()); });
      }))
      .def("stage", [](StaticInputs& s, py::handle values, py::handle n, py::handle stream) {
        translate_errors([&] { s.stage(values.ptr(), n.ptr(), stream.ptr()); });
      })
      .def("views", &StaticInputs::views)
      .def_property_readonly("device", &StaticInputs::device);

  m.def("_check_dtype", [](py::handle dtype, const std::string& what) {
    translate_errors([&] { parse_dtype(dtype.ptr(), what.c_str()); });
  });
  m.def("_set_fallback", [](py::handle fn) { set_fallback(fn.ptr()); });
  m.def("_register_buffer_types", [](py::handle ndarray, py::handle generic, py::handle array) {
    register_buffer_types(ndarray.ptr(), generic.ptr(), array.ptr());
  });
}

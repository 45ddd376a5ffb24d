// pinstage._C: the compiled core's Python surface. pinstage/__init__.py re-exports it.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "fastcall.h"
#include "buffer_source.h"
#include "kernels/cache_index_plan.h"
#include "item_plan.h"
#include "stage.h"
#include "staging_options.h"
#include "staging_registry.h"
#include "target.h"

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace py = pybind11;

namespace pinstage {
void bind_ring_allocator_for_tests(py::module_& m);

namespace {

py::dict stats(py::handle device) {
  bool is_cpu = !cuda_available();
  c10::DeviceIndex index = -1;
  if (!device.is_none()) {
    auto d = parse_cuda_device(device.ptr(), &is_cpu);
    if (d) index = *d;
  }
  py::dict s;
  if (is_cpu) {
    auto& c = cpu_counters();
    s["device"] = "cpu";
    s["ring_bytes"] = 0;
    s["ring_allocated"] = false;
    s["in_flight_bytes"] = 0;
    s["peak_in_flight_bytes"] = 0;
    s["pending_regions"] = 0;
    s["calls"] = c.calls.load();
    s["bytes_staged"] = c.bytes_staged.load();
    s["copies"] = 0;
    s["fallbacks"] = c.fallbacks.load();
    s["overflows"] = 0;
    s["waits"] = 0;
    s["wraps"] = 0;
    s["events_created"] = 0;
    s["overflow_reserved_bytes"] = 0;
    s["overflow_in_flight_bytes"] = 0;
    s["on_full"] = on_full_name(default_on_full());
    return s;
  }
#ifdef PINSTAGE_WITH_CUDA
  if (index < 0) index = c10::cuda::current_device();
  StagingRing& ring = ring_for(index);
  const auto snap = ring.snapshot();
  auto& c = ring.counters();
  s["device"] = "cuda:" + std::to_string(index);
  s["ring_bytes"] = snap.ring_bytes;
  s["ring_allocated"] = snap.allocated;
  s["in_flight_bytes"] = snap.in_flight_bytes;
  s["peak_in_flight_bytes"] = snap.peak_in_flight_bytes;
  s["pending_regions"] = snap.pending_regions;
  s["calls"] = c.calls.load();
  s["bytes_staged"] = c.bytes_staged.load();
  s["copies"] = c.copies.load();
  s["fallbacks"] = c.fallbacks.load();
  s["overflows"] = snap.overflows;
  s["waits"] = snap.waits;
  s["wraps"] = snap.wraps;
  s["events_created"] = snap.events_created;
  s["overflow_reserved_bytes"] = snap.overflow_reserved_bytes;
  s["overflow_in_flight_bytes"] = snap.overflow_in_flight_bytes;
  s["on_full"] = on_full_name(ring.on_full());
#endif
  return s;
}

void configure(py::handle ring_bytes, py::handle on_full, py::handle device) {
  std::optional<size_t> bytes;
  if (!ring_bytes.is_none()) {
    TORCH_CHECK_TYPE(PyLong_Check(ring_bytes.ptr()) && !PyBool_Check(ring_bytes.ptr()),
                     "pinstage.configure: ring_bytes must be an int, got ", Py_TYPE(ring_bytes.ptr())->tp_name);
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(ring_bytes.ptr(), &overflow);
    if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow > 0) {
      PyErr_Format(PyExc_OverflowError, "pinstage.configure: ring_bytes=%R is too large", ring_bytes.ptr());
      throw py::error_already_set();
    }
    TORCH_CHECK_VALUE(overflow == 0 && n > 0, "pinstage.configure: ring_bytes must be positive, got ",
                      py::repr(ring_bytes).cast<std::string>());
    bytes = static_cast<size_t>(n);
  }
  std::optional<OnFull> mode;
  if (!on_full.is_none()) {
    TORCH_CHECK_TYPE(PyUnicode_Check(on_full.ptr()), "pinstage.configure: on_full must be a str");
    const char* text = PyUnicode_AsUTF8(on_full.ptr());
    if (text == nullptr) {
      PyErr_Clear();
      TORCH_CHECK_VALUE(false, "pinstage.configure: on_full must be \"overflow\", \"wait\" or \"error\"");
    }
    mode = parse_on_full(text);
  }
  std::optional<int> index;
  if (!device.is_none()) {
    bool is_cpu = false;
    auto d = parse_cuda_device(device.ptr(), &is_cpu);
    TORCH_CHECK_VALUE(!is_cpu, "pinstage.configure: the CPU has no staging ring");
#ifdef PINSTAGE_WITH_CUDA
    index = *d >= 0 ? *d : c10::cuda::current_device();
#endif
  }
  configure_rings(bytes, mode, index);
}

// c10 errors carry a C++ backtrace in what(); users get torch's exception classes and the message.
void translate_c10_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const c10::Error&) {
    set_python_error(std::current_exception());
  }
}

}  // namespace
}  // namespace pinstage

PYBIND11_MODULE(_C, m) {
  using namespace pinstage;
  m.doc() = "pinstage compiled core: pinned staging ring, converter and staging operations";
  py::register_exception_translator(&translate_c10_errors);

  m.add_object("stage_to_device", py::reinterpret_steal<py::object>(PyCFunction_NewEx(
                                      &kStageToDeviceDef, nullptr, py::str("pinstage._C").ptr())));
  m.def(
      "stage_many",
      [](py::handle items, py::handle stream, py::handle device) {
        return stage_many(items.ptr(), stream.ptr(), device.ptr());
      },
      py::arg("items"), py::arg("stream") = py::none(), py::kw_only(), py::arg("device") = py::none(),
      "stage_many(items, stream=None, *, device=None) -> list[Tensor]\n\n"
      "items: [(data, dtype), ...]. All items go into one ring region and one device allocation, moved by\n"
      "ONE host-to-device copy; the results are views of that allocation.");
  m.def(
      "stage_into",
      [](py::handle data, py::handle out, py::handle stream) {
        stage_into(data.ptr(), out.ptr(), stream.ptr());
        return py::reinterpret_borrow<py::object>(out);
      },
      py::arg("data"), py::arg("out"), py::arg("stream") = py::none(),
      "stage_into(data, out, stream=None) -> out\n\n"
      "Fills the existing contiguous tensor `out` (same number of elements, converted to out.dtype) with\n"
      "one asynchronous copy on `stream` (default: out's device's current stream). For CUDA-graph static\n"
      "inputs: call it before graph.replay().");
  m.def("stats", &stats, py::arg("device") = py::none(),
        "stats(device=None) -> dict: the ring's size and occupancy and the staging counters of one device");
  m.def("configure", &configure, py::kw_only(), py::arg("ring_bytes") = py::none(), py::arg("on_full") = py::none(),
        py::arg("device") = py::none(),
        "configure(*, ring_bytes=None, on_full=None, device=None): ring size in bytes and what to do when the\n"
        "ring is full (\"overflow\" | \"wait\" | \"error\"), for one device or (device=None) all");
  m.def(
      "_target_device",
      [](py::handle stream, py::handle device) {
        const Target t = resolve_target(stream.ptr(), device.ptr());
        return t.cuda ? c10::Device(c10::kCUDA, t.index) : c10::Device(c10::kCPU);
      },
      py::arg("stream"), py::arg("device"),
      "The device staging with these arguments targets: the stream's, else device, else the current CUDA "
      "device, else the CPU");
  m.def("_set_fallback", [](py::handle fn) { set_fallback(fn.ptr()); });
  m.def("_register_buffer_types", [](py::handle ndarray, py::handle generic, py::handle array) {
    register_buffer_types(ndarray.ptr(), generic.ptr(), array.ptr());
  });
  m.def("_built_with_cuda", []() {
#ifdef PINSTAGE_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  bind_ring_allocator_for_tests(m);
  bind_cache_index_plan(m);
}

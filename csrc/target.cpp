#include "target.h"

#include <torch/csrc/Device.h>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "stream_fence.h"
#endif

#include <atomic>

namespace py = pybind11;

namespace pinstage {

bool cuda_available() {
#ifdef PINSTAGE_WITH_CUDA
  static const bool available = c10::cuda::device_count() > 0;
  return available;
#else
  return false;
#endif
}

namespace {

// Engines pass the same device string every step ("cuda", "cuda:0"), and c10's parser costs a few
// hundred ns of a call that is a few microseconds in all, so the last string parsed is remembered.
// It is held, so that no other string can take its address, and a str's text never changes, so
// the same object means the same device. Only exact str objects are remembered: letting go of one
// runs no Python code (a subclass's __del__ could stage, and re-enter this, mid-update), and both
// fields are written before the old string is let go. Callers hold the GIL.
c10::Device parse_device_string(PyObject* text) {
  static PyObject* last_text = nullptr;
  static c10::Device last_device(c10::kCPU);
  if (text == last_text) return last_device;
  const c10::Device d(py::reinterpret_borrow<py::str>(text).cast<std::string>());  // throws if invalid
  if (PyUnicode_CheckExact(text)) {
    PyObject* old = last_text;
    Py_INCREF(text);
    last_text = text;
    last_device = d;
    Py_XDECREF(old);
  }
  return d;
}

}  // namespace

std::optional<c10::DeviceIndex> parse_cuda_device(PyObject* device, bool* is_cpu) {
  c10::Device d(c10::kCPU);
  if (THPDevice_Check(device)) {
    d = reinterpret_cast<THPDevice*>(device)->device;
  } else if (PyUnicode_Check(device)) {
    d = parse_device_string(device);
  } else if (PyLong_Check(device) && !PyBool_Check(device)) {
    const long idx = PyLong_AsLong(device);
    TORCH_CHECK_VALUE(idx >= 0 && !PyErr_Occurred(), "pinstage: device index must be a non-negative int");
    d = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(idx));
  } else {
    TORCH_CHECK_TYPE(false, "pinstage: device must be a torch.device, str or int, got ", Py_TYPE(device)->tp_name);
  }
  *is_cpu = d.is_cpu();
  if (d.is_cpu()) return std::nullopt;
  TORCH_CHECK_VALUE(d.is_cuda(), "pinstage: unsupported device ", d.str(), " (CPU and CUDA only)");
  TORCH_CHECK(cuda_available(), "pinstage: device ", d.str(), " requested but ",
#ifdef PINSTAGE_WITH_CUDA
              "no CUDA device is visible"
#else
              "pinstage was built without CUDA (PINSTAGE_FORCE_CPU or no CUDA toolkit at build time)"
#endif
  );
  return d.has_index() ? d.index() : static_cast<c10::DeviceIndex>(-1);
}

Target resolve_target(PyObject* stream, PyObject* device) {
  Target t;
  if (stream != Py_None) {
#ifdef PINSTAGE_WITH_CUDA
    py::handle s(stream);
    TORCH_CHECK_TYPE(py::hasattr(s, "stream_id") && py::hasattr(s, "device_index"),
                     "pinstage: stream must be a torch.cuda.Stream or None, got ", Py_TYPE(stream)->tp_name);
    const auto id = s.attr("stream_id").cast<int64_t>();
    const auto index = s.attr("device_index").cast<int64_t>();
    const auto type = s.attr("device_type").cast<int64_t>();
    TORCH_CHECK_VALUE(static_cast<c10::DeviceType>(type) == c10::DeviceType::CUDA, "pinstage: stream is not a CUDA stream");
    t.cuda = true;
    t.index = static_cast<c10::DeviceIndex>(index);
    t.stream = c10::cuda::CUDAStream(
        c10::Stream::unpack3(id, static_cast<c10::DeviceIndex>(index), static_cast<c10::DeviceType>(type)));
    if (device != Py_None) {
      bool is_cpu = false;
      auto d = parse_cuda_device(device, &is_cpu);
      TORCH_CHECK_VALUE(!is_cpu && (*d == -1 || *d == t.index), "pinstage: stream is on cuda:", static_cast<int>(t.index),
                        " but device says otherwise");
    }
    ensure_cuda_initialized();
    return t;
#else
    TORCH_CHECK_VALUE(false, "pinstage: a stream was given but pinstage was built without CUDA");
#endif
  }
  std::optional<c10::DeviceIndex> index;
  if (device != Py_None) {
    bool is_cpu = false;
    index = parse_cuda_device(device, &is_cpu);
    if (is_cpu) return t;
  } else if (!cuda_available()) {
    return t;
  } else {
    index = -1;
  }
#ifdef PINSTAGE_WITH_CUDA
  ensure_cuda_initialized();
  t.cuda = true;
  t.index = *index >= 0 ? *index : c10::cuda::current_device();
  TORCH_CHECK_VALUE(t.index < c10::cuda::device_count(), "pinstage: cuda:", static_cast<int>(t.index),
                    " does not exist (", static_cast<int>(c10::cuda::device_count()), " visible)");
  t.stream = c10::cuda::getCurrentCUDAStream(t.index);
#endif
  return t;
}

#ifdef PINSTAGE_WITH_CUDA
void check_not_capturing(const c10::cuda::CUDAStream& stream, const char* api) {
  TORCH_CHECK(!stream_is_capturing(stream.stream()), "pinstage.", api,
              ": the stream is capturing a CUDA graph. A captured copy would read staging memory that is "
              "reused before the graph replays; stage_into(data, static_input) before graph.replay() is the "
              "supported pattern");
}

void ensure_cuda_initialized() {
  static std::atomic<bool> done{false};
  if (done.load(std::memory_order_acquire)) return;
  py::module_::import("torch.cuda").attr("_lazy_init")();
  done.store(true, std::memory_order_release);
}
#endif

}  // namespace pinstage

#include "target.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/Stream.h>

#include <string>

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

// A CUDA device index as a c10::DeviceIndex (int8), after checking it names a visible device:
// casting first would make 256 mean cuda:0 and 200 mean "the current device".
c10::DeviceIndex checked_cuda_index(long long index, const char* what) {
  TORCH_CHECK_VALUE(index >= 0, "pinstage: ", what, " index must be non-negative, got ", index);
  TORCH_CHECK(cuda_available(), "pinstage: ", what, " cuda:", index, " requested but ",
#ifdef PINSTAGE_WITH_CUDA
              "no CUDA device is visible"
#else
              "pinstage was built without CUDA (PINSTAGE_FORCE_CPU or no CUDA toolkit at build time)"
#endif
  );
  const long long count = visible_cuda_devices();
  TORCH_CHECK_VALUE(index < count, "pinstage: ", what, " cuda:", index, " does not exist (", count,
                    " CUDA device", count == 1 ? " is" : "s are", " visible)");
  return static_cast<c10::DeviceIndex>(index);
}

// "cpu", "cuda" and "cuda:N" with N read in full (c10's parser keeps the low 8 bits of N); any
// other text goes to c10::Device, whose message says what is wrong with it.
c10::Device parse_device_text(PyObject* text) {
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  if (utf8 == nullptr) {
    PyErr_Clear();
    TORCH_CHECK_VALUE(false, "pinstage: device must be a device string such as 'cuda:0'; got a str that is not valid text");
  }
  const std::string s(utf8, static_cast<size_t>(size));
  if (s == "cpu") return c10::Device(c10::kCPU);
  if (s == "cuda") return c10::Device(c10::kCUDA);
  if (s.size() > 5 && s.compare(0, 5, "cuda:") == 0 && s.size() <= 5 + 18 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos) {
    return c10::Device(c10::kCUDA, checked_cuda_index(std::stoll(s.substr(5)), "device"));
  }
  return c10::Device(s);  // throws for malformed text
}

}  // namespace

long long visible_cuda_devices() {
#ifdef PINSTAGE_WITH_CUDA
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

std::optional<c10::DeviceIndex> parse_cuda_device(PyObject* device, bool* is_cpu) {
  c10::Device d(c10::kCPU);
  if (THPDevice_Check(device)) {
    d = reinterpret_cast<THPDevice*>(device)->device;
  } else if (PyUnicode_Check(device)) {
    d = parse_device_text(device);
  } else if (PyLong_Check(device) && !PyBool_Check(device)) {
    int overflow = 0;
    const long long idx = PyLong_AsLongLongAndOverflow(device, &overflow);
    if (idx == -1 && PyErr_Occurred()) PyErr_Clear();
    TORCH_CHECK_VALUE(overflow == 0, "pinstage: device index is out of range");
    d = c10::Device(c10::kCUDA, checked_cuda_index(idx, "device"));
  } else {
    TORCH_CHECK_TYPE(false, "pinstage: device must be a torch.device, str or int, got ", Py_TYPE(device)->tp_name);
  }
  *is_cpu = d.is_cpu();
  if (d.is_cpu()) return std::nullopt;
  TORCH_CHECK_VALUE(d.is_cuda(), "pinstage: unsupported device ", d.str(), " (CPU and CUDA only)");
  if (!d.has_index()) {
    checked_cuda_index(0, "device");  // says that CUDA is missing, if it is
    return static_cast<c10::DeviceIndex>(-1);
  }
  return checked_cuda_index(d.index(), "device");
}

Target resolve_target(PyObject* stream, PyObject* device) {
  Target t;
  if (stream != Py_None) {
    // The fields of torch.Stream itself: reading them runs no Python code.
    TORCH_CHECK_TYPE(THPStreamClass != nullptr && PyObject_TypeCheck(stream, THPStreamClass),
                     "pinstage: stream must be a torch.cuda.Stream or None, got ", Py_TYPE(stream)->tp_name);
    const auto* s = reinterpret_cast<const THPStream*>(stream);
    TORCH_CHECK_VALUE(static_cast<c10::DeviceType>(s->device_type) == c10::DeviceType::CUDA,
                      "pinstage: stream is not a CUDA stream (device type ",
                      c10::DeviceTypeName(static_cast<c10::DeviceType>(s->device_type)), ")");
#ifdef PINSTAGE_WITH_CUDA
    t.cuda = true;
    t.index = checked_cuda_index(s->device_index, "stream's device");
    t.stream = c10::cuda::CUDAStream(c10::Stream::unpack3(s->stream_id, t.index, c10::DeviceType::CUDA));
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

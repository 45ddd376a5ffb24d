#include "copy/target.h"

#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Stream.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "ring/stream_fence.h"
#endif

namespace pinstage {
namespace {

std::atomic<bool> g_cuda_initialized{false};

// FakeTensorMode set aside for a scope, as torch's unset_fake_temporarily() does: torch's lazy CUDA
// initialisation does nothing under it (fake CUDA tensors need none), but pinstage allocates real
// device memory even there.
class FakeModeSetAside {
 public:
  FakeModeSetAside() : mode_(c10::impl::TorchDispatchModeTLS::unset_mode(c10::impl::TorchDispatchModeKey::FAKE)) {}
  ~FakeModeSetAside() {
    if (mode_) c10::impl::TorchDispatchModeTLS::set_mode(*mode_, c10::impl::TorchDispatchModeKey::FAKE);
  }
  FakeModeSetAside(const FakeModeSetAside&) = delete;
  FakeModeSetAside& operator=(const FakeModeSetAside&) = delete;

 private:
  std::optional<std::shared_ptr<c10::impl::PyObject_TorchDispatchMode>> mode_;
};

// torch's own lazy CUDA initialisation (torch.cuda._lazy_init: the caching allocator needs it done),
// which also refuses a child forked after its parent used CUDA ("Cannot re-initialize CUDA in forked
// subprocess"): torch's fork handler marks the child, so the fast path below is skipped there.
[[maybe_unused]] void ensure_cuda_initialized() {
  if (g_cuda_initialized.load(std::memory_order_acquire) && !torch::utils::is_device_in_bad_fork(at::kCUDA)) return;
  {
    const FakeModeSetAside no_fake_mode;
    torch::utils::device_lazy_init(at::kCUDA);
  }
  g_cuda_initialized.store(true, std::memory_order_release);
}

// A CUDA device index as a c10::DeviceIndex (int8), after checking it names a visible device:
// casting first would make 256 mean cuda:0 and 200 mean "the current device".
c10::DeviceIndex checked_cuda_index(long long index, const char* what) {
  TORCH_CHECK_VALUE(index >= 0, "pinstage: ", what, " index must be non-negative, got ", index);
  if (visible_cuda_devices() == 0) built_without_cuda(c10::Device(c10::kCUDA));
  const int count = visible_cuda_devices();
  TORCH_CHECK_VALUE(index < count, "pinstage: ", what, " cuda:", index, " does not exist (", count, " CUDA device",
                    count == 1 ? " is" : "s are", " visible)");
  return static_cast<c10::DeviceIndex>(index);
}

// "cpu", "cuda" and "cuda:N" with N read in full (c10's parser keeps the low 8 bits of N); any
// other text goes to c10::Device, whose message says what is wrong with it.
c10::Device parse_device_text(PyObject* text) {
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  if (utf8 == nullptr) {
    PyErr_Clear();
    TORCH_CHECK_VALUE(false,
                      "pinstage: device must be a device string such as 'cuda:0'; got a str that is not valid text");
  }
  const std::string s(utf8, static_cast<size_t>(size));
  if (s == "cpu") return c10::Device(c10::kCPU);
  if (s == "cuda") return c10::Device(c10::kCUDA);
  if (s.size() > 5 && s.size() <= 5 + 18 && s.compare(0, 5, "cuda:") == 0 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos) {
    return c10::Device(c10::kCUDA, checked_cuda_index(std::stoll(s.substr(5)), "device"));
  }
  return c10::Device(s);  // throws for malformed text
}

// The device a non-None device argument names, its CUDA index checked; "cuda" alone keeps no index.
c10::Device parse_device(PyObject* device) {
  c10::Device d(c10::kCPU);
  if (THPDevice_Check(device)) {
    d = reinterpret_cast<THPDevice*>(device)->device;
  } else if (PyUnicode_Check(device)) {
    d = parse_device_text(device);
  } else if (PyLong_Check(device) && !PyBool_Check(device)) {
    int overflow = 0;
    const long long index = PyLong_AsLongLongAndOverflow(device, &overflow);
    if (index == -1 && PyErr_Occurred()) PyErr_Clear();
    TORCH_CHECK_VALUE(overflow == 0, "pinstage: device index is out of range");
    d = c10::Device(c10::kCUDA, checked_cuda_index(index, "device"));
  } else {
    TORCH_CHECK_TYPE(false, "pinstage: device must be a torch.device, str or int, got ", Py_TYPE(device)->tp_name);
  }
  if (d.is_cpu()) return d;
  TORCH_CHECK_VALUE(d.is_cuda(), "pinstage: unsupported device ", d.str(), " (CPU and CUDA only)");
  if (!d.has_index()) {
    if (visible_cuda_devices() == 0) built_without_cuda(d);
    return d;
  }
  return c10::Device(c10::kCUDA, checked_cuda_index(d.index(), "device"));
}

}  // namespace

int visible_cuda_devices() {
#ifdef PINSTAGE_WITH_CUDA
  static const int count = c10::cuda::device_count();
  return count;
#else
  return 0;
#endif
}

void built_without_cuda(const c10::Device& device) {
#ifdef PINSTAGE_WITH_CUDA
  TORCH_CHECK(false, "pinstage: ", device.str(), " requested but no CUDA device is visible");
#else
  TORCH_CHECK(false, "pinstage: ", device.str(),
              " requested but pinstage was built without CUDA (it was built where no GPU or CUDA toolkit was found; "
              "see the README's install section)");
#endif
}

c10::Device resolve_device(PyObject* device) {
  c10::Device d =
      device == Py_None ? c10::Device(visible_cuda_devices() > 0 ? c10::kCUDA : c10::kCPU) : parse_device(device);
  if (d.is_cpu()) return d;
#ifdef PINSTAGE_WITH_CUDA
  ensure_cuda_initialized();
  if (!d.has_index()) d.set_index(c10::cuda::current_device());
  return d;
#else
  built_without_cuda(d);
#endif
}

Target resolve_target(PyObject* stream, PyObject* device) {
  Target t;
  if (stream == Py_None) {
    t.device = resolve_device(device);
#ifdef PINSTAGE_WITH_CUDA
    if (t.device.is_cuda()) t.stream = c10::cuda::getCurrentCUDAStream(t.device.index());
#endif
    return t;
  }
  // The fields of torch.Stream itself: reading them runs no Python code.
  TORCH_CHECK_TYPE(THPStreamClass != nullptr && PyObject_TypeCheck(stream, THPStreamClass),
                   "pinstage: stream must be a torch.cuda.Stream or None, got ", Py_TYPE(stream)->tp_name);
  const auto* s = reinterpret_cast<const THPStream*>(stream);
  TORCH_CHECK_VALUE(static_cast<c10::DeviceType>(s->device_type) == c10::DeviceType::CUDA,
                    "pinstage: stream is not a CUDA stream (device type ",
                    c10::DeviceTypeName(static_cast<c10::DeviceType>(s->device_type)), ")");
  t.device = c10::Device(c10::kCUDA, checked_cuda_index(s->device_index, "stream's device"));
  if (device != Py_None) {
    const c10::Device d = parse_device(device);
    TORCH_CHECK_VALUE(d.is_cuda() && (!d.has_index() || d.index() == t.device.index()), "pinstage: stream is on ",
                      t.device.str(), " but device is ", d.str());
  }
#ifdef PINSTAGE_WITH_CUDA
  ensure_cuda_initialized();
  t.stream = c10::cuda::CUDAStream(c10::Stream::unpack3(s->stream_id, t.device.index(), c10::DeviceType::CUDA));
#endif
  return t;
}

Target target_on(const c10::Device& device, PyObject* stream, const char* api) {
  Target t;
  t.device = device;
  if (device.is_cpu()) {
    TORCH_CHECK_VALUE(stream == Py_None, "pinstage.", api, ": the data is on the CPU; no stream applies");
    return t;
  }
  TORCH_CHECK_VALUE(device.is_cuda(), "pinstage.", api, ": the data is on ", device.str(), "; CUDA or CPU only");
#ifdef PINSTAGE_WITH_CUDA
  ensure_cuda_initialized();
  if (stream == Py_None) {
    t.stream = c10::cuda::getCurrentCUDAStream(device.index());
  } else {
    t.stream = resolve_target(stream, Py_None).stream;
    TORCH_CHECK_VALUE(t.stream->device_index() == device.index(), "pinstage.", api,
                      ": stream is on cuda:", static_cast<int>(t.stream->device_index()), " but the data is on ",
                      device.str());
  }
  check_not_capturing(*t.stream, api);
  return t;
#else
  built_without_cuda(device);
#endif
}

#ifdef PINSTAGE_WITH_CUDA
void check_not_capturing(const c10::cuda::CUDAStream& stream, const char* api) {
  TORCH_CHECK(!stream_is_capturing(stream.stream()), "pinstage.", api,
              ": the stream is capturing a CUDA graph. A captured copy would use pinned ring memory that is "
              "reused before the graph replays; stage_into(data, static_input) before graph.replay() is the "
              "supported pattern");
}
#endif

}  // namespace pinstage

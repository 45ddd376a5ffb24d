// Where a call's result goes: the CPU, or a CUDA device and the stream its copy is enqueued on; the
// one place that reads device and stream arguments. Resolution order: the stream's device if a
// stream is given, else `device`, else the current CUDA device when CUDA is available, else the CPU.
#pragma once

#include <Python.h>
#include <c10/core/Device.h>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>

namespace pinstage {

struct Target {
  c10::Device device{c10::kCPU};
#ifdef PINSTAGE_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // set for a CUDA device
#endif
};

// stream: None or a torch.cuda.Stream; device: None, torch.device, str or int.
Target resolve_target(PyObject* stream, PyObject* device);

// A device argument alone (None: the current CUDA device, or the CPU without CUDA). ValueError for
// an index that names no visible device, RuntimeError for a CUDA device without CUDA.
c10::Device resolve_device(PyObject* device);

// How many CUDA devices this process sees (0 without CUDA).
int visible_cuda_devices();

// RuntimeError for a CUDA device in a build without CUDA.
[[noreturn]] void built_without_cuda(const c10::Device& device);

// The target of a copy to or from `device`, which the data already names (stage_into's out, the
// static inputs, fetched tensors): for CUDA, `stream` (None: the device's current stream) checked
// to be on the device and not capturing; on the CPU, stream must be None (ValueError).
Target target_on(const c10::Device& device, PyObject* stream, const char* api);

#ifdef PINSTAGE_WITH_CUDA
// A copy enqueued on a stream that is capturing a CUDA graph would use ring memory that is reused
// long before the graph replays: refused with RuntimeError.
void check_not_capturing(const c10::cuda::CUDAStream& stream, const char* api);
#endif

}  // namespace pinstage

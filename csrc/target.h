// Where a staging call's result goes: the CPU, or a CUDA device and the stream the copy is
// enqueued on. Resolution order (DESIGN.md): the stream's device if a stream is given, else
// `device`, else the current CUDA device when CUDA is available, else the CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>

namespace pinstage {

struct Target {
  bool cuda = false;
  c10::DeviceIndex index = -1;
#ifdef PINSTAGE_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // set when cuda
#endif
};

// stream: None or a torch.cuda.Stream; device: None, torch.device, str or int.
Target resolve_target(PyObject* stream, PyObject* device);

// The CUDA device a torch.device / str / int names (-1 for "cuda" without an index); CPU gives
// nullopt. ValueError for an index that names no visible device.
std::optional<c10::DeviceIndex> parse_cuda_device(PyObject* device, bool* is_cpu);

bool cuda_available();

// How many CUDA devices this process sees (0 without CUDA).
long long visible_cuda_devices();

#ifdef PINSTAGE_WITH_CUDA
// Streams that are capturing a CUDA graph are refused: a captured copy would read ring memory that
// is reused long before the graph replays.
void check_not_capturing(const c10::cuda::CUDAStream& stream, const char* api);

// torch initialises CUDA lazily from Python; the caching allocator needs it done.
void ensure_cuda_initialized();
#endif

}  // namespace pinstage

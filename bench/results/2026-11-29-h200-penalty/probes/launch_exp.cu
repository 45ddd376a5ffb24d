// Experiment: host cost of getting a small payload onto the GPU: pinned memcpy (+event) vs kernel
// parameters.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <chrono>
#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/python_variable.h>

template <int N>
struct Payload { unsigned char bytes[N]; };

template <int N>
__global__ void write_payload(Payload<N> p, unsigned char* dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = p.bytes[i];
}
template <int N>
__global__ void write_payload8(Payload<N> p, uint64_t* dst, int n8) {
  const uint64_t* src = reinterpret_cast<const uint64_t*>(p.bytes);
  for (int i = threadIdx.x; i < n8; i += blockDim.x) dst[i] = src[i];
}
__global__ void empty_kernel() {}

static double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <int N>
static void launch(cudaStream_t s, unsigned char* dst, int n, const unsigned char* host) {
  Payload<N> p;
  memcpy(p.bytes, host, n);
  write_payload8<N><<<1, 128, 0, s>>>(p, reinterpret_cast<uint64_t*>(dst), n / 8);
}

double run(std::string variant, int64_t n, int reps, torch::Tensor dst, torch::Tensor pinned) {
  cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
  unsigned char* d = static_cast<unsigned char*>(dst.data_ptr());
  unsigned char* h = static_cast<unsigned char*>(pinned.data_ptr());
  static cudaEvent_t ev = nullptr;
  if (!ev) cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  double t0 = now_ns();
  for (int r = 0; r < reps; ++r) {
    if (variant == "memcpy") {
      cudaMemcpyAsync(d, h + (r % 64) * 4096, n, cudaMemcpyHostToDevice, s);
    } else if (variant == "memcpy_event") {
      cudaMemcpyAsync(d, h + (r % 64) * 4096, n, cudaMemcpyHostToDevice, s);
      cudaEventRecord(ev, s);
    } else if (variant == "empty_kernel") {
      empty_kernel<<<1, 1, 0, s>>>();
    } else if (variant == "param") {
      if (n <= 256) launch<256>(s, d, n, h);
      else if (n <= 1024) launch<1024>(s, d, n, h);
      else if (n <= 4096) launch<4096>(s, d, n, h);
      else launch<32000>(s, d, n, h);
    } else if (variant == "param4k") {
      launch<4096>(s, d, n, h);
    } else if (variant == "param32k") {
      launch<32000>(s, d, n, h);
    } else if (variant == "is_capturing") {
      cudaStreamCaptureStatus st;
      cudaStreamIsCapturing(s, &st);
    } else if (variant == "guard") {
      c10::cuda::CUDAGuard g(0);
    } else if (variant == "current_stream") {
      volatile auto cs = c10::cuda::getCurrentCUDAStream(0).stream();
      (void)cs;
    } else if (variant == "alloc") {
      at::Tensor t = at::detail::empty_generic({n / 8}, c10::cuda::CUDACachingAllocator::get(),
                                               c10::DispatchKeySet(c10::DispatchKey::CUDA), at::kLong, std::nullopt);
    } else if (variant == "alloc_wrap") {
      at::Tensor t = at::detail::empty_generic({n / 8}, c10::cuda::CUDACachingAllocator::get(),
                                               c10::DispatchKeySet(c10::DispatchKey::CUDA), at::kLong, std::nullopt);
      PyObject* o = THPVariable_Wrap(t);
      Py_DECREF(o);
    } else if (variant == "event_query") {
      cudaEventQuery(ev);
    } else if (variant == "get_device") {
      int dev; cudaGetDevice(&dev);
    } else {
      throw std::runtime_error("variant");
    }
  }
  double t1 = now_ns();
  C10_CUDA_CHECK(cudaGetLastError());
  return (t1 - t0) / reps;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }

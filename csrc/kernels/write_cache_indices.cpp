// write_cache_indices as a torch custom op: CPU and CUDA implementations, and a no-op for fake
// tensors (it only writes into req_to_token).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "convert/dtypes.h"
#include "kernels/cache_index_checks.h"
#include "kernels/write_cache_indices.h"

namespace pinstage {
namespace {

CacheIndexParams cache_index_params(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                    const at::Tensor& prefix_pointers, const at::Tensor& prefix_lens,
                                    const at::Tensor& seq_lens, const at::Tensor& out_cache_offsets,
                                    const at::Tensor& out_cache_loc) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  const int64_t batch = req_pool_indices.numel();
  TORCH_CHECK_VALUE(batch <= INT32_MAX, kOp, ": at most 2**31 - 1 requests per call, got ", batch);
  check_per_request(req_pool_indices, "req_pool_indices", at::kLong, batch, device);
  check_per_request(prefix_pointers, "prefix_pointers", at::kUInt64, batch, device);
  check_per_request(prefix_lens, "prefix_lens", at::kLong, batch, device);
  check_per_request(seq_lens, "seq_lens", at::kLong, batch, device);
  check_per_request(out_cache_offsets, "out_cache_offsets", at::kLong, batch, device);
  check_out_cache_loc(out_cache_loc, device);
  return CacheIndexParams{
      req_to_token.data_ptr<int32_t>(),
      req_to_token.stride(0),
      req_to_token.size(0),
      req_to_token.size(1),
      batch,
      req_pool_indices.const_data_ptr<int64_t>(),
      static_cast<const uint64_t*>(prefix_pointers.const_data_ptr()),
      prefix_lens.const_data_ptr<int64_t>(),
      seq_lens.const_data_ptr<int64_t>(),
      out_cache_offsets.const_data_ptr<int64_t>(),
      out_cache_loc.const_data_ptr<int64_t>(),
      out_cache_loc.numel(),
  };
}

void write_cache_indices_cpu(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                             const at::Tensor& prefix_pointers, const at::Tensor& prefix_lens,
                             const at::Tensor& seq_lens, const at::Tensor& out_cache_offsets,
                             const at::Tensor& out_cache_loc) {
  const CacheIndexParams p = cache_index_params(req_to_token, req_pool_indices, prefix_pointers, prefix_lens,
                                                seq_lens, out_cache_offsets, out_cache_loc);
  // Every value is checked before the first write, so a bad request leaves req_to_token untouched.
  for (int64_t i = 0; i < p.batch; ++i) {
    check_request_span(i, p.req_pool_indices[i], p.prefix_lens[i], p.seq_lens[i], p.rows, p.max_context_len);
    // Bounds as subtractions that cannot overflow: 0 <= prefix <= seq was checked above.
    const int64_t extend_len = p.seq_lens[i] - p.prefix_lens[i];
    const int64_t offset = p.out_cache_offsets[i];
    TORCH_CHECK_VALUE(offset >= 0 && offset <= p.out_cache_len && extend_len <= p.out_cache_len - offset, kOp,
                      ": request ", i, ": out_cache_offsets is ", offset, " with ", extend_len,
                      " new tokens, outside out_cache_loc (", p.out_cache_len, " elements)");
    TORCH_CHECK_VALUE(p.prefix_lens[i] == 0 || p.prefix_pointers[i] != 0, kOp, ": request ", i,
                      ": prefix_pointers is null but prefix_lens is ", p.prefix_lens[i]);
  }
  for (int64_t i = 0; i < p.batch; ++i) {
    int32_t* dst = p.req_to_token + p.req_pool_indices[i] * p.row_stride;
    const auto* cached = reinterpret_cast<const int64_t*>(p.prefix_pointers[i]);
    for (int64_t pos = 0; pos < p.prefix_lens[i]; ++pos) dst[pos] = static_cast<int32_t>(cached[pos]);
    const int64_t* extend = p.out_cache_loc + p.out_cache_offsets[i];
    for (int64_t pos = p.prefix_lens[i]; pos < p.seq_lens[i]; ++pos) {
      dst[pos] = static_cast<int32_t>(extend[pos - p.prefix_lens[i]]);
    }
  }
}

#ifdef PINSTAGE_WITH_CUDA
// Values stay on the device (reading them would make the host wait): cache_index_plan checked them
// before they were staged, and the kernel skips rows out of bounds.
void write_cache_indices_cuda(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                              const at::Tensor& prefix_pointers, const at::Tensor& prefix_lens,
                              const at::Tensor& seq_lens, const at::Tensor& out_cache_offsets,
                              const at::Tensor& out_cache_loc) {
  const CacheIndexParams p = cache_index_params(req_to_token, req_pool_indices, prefix_pointers, prefix_lens,
                                                seq_lens, out_cache_offsets, out_cache_loc);
  const c10::cuda::CUDAGuard guard(req_to_token.device());
  launch_write_cache_indices(p, c10::cuda::getCurrentCUDAStream(req_to_token.device().index()).stream());
}
#endif

void write_cache_indices_fake(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&) {}

}  // namespace
}  // namespace pinstage

TORCH_LIBRARY(pinstage, m) {
  m.def(
      "write_cache_indices(Tensor(a!) req_to_token, Tensor req_pool_indices, Tensor prefix_pointers, "
      "Tensor prefix_lens, Tensor seq_lens, Tensor out_cache_offsets, Tensor out_cache_loc) -> ()");
}

TORCH_LIBRARY_IMPL(pinstage, CPU, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_cpu); }

#ifdef PINSTAGE_WITH_CUDA
TORCH_LIBRARY_IMPL(pinstage, CUDA, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_cuda); }
#endif

TORCH_LIBRARY_IMPL(pinstage, Meta, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_fake); }


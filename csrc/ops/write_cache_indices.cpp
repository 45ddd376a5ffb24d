// write_cache_indices as a torch custom op: CPU and CUDA implementations, and a no-op for fake
// tensors (it only writes into req_to_token). The per-request tensors are on req_to_token's device;
// for the CUDA op they may also be CPU tensors, copied with the prefix table in the op's one copy.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>

#include "ring/options.h"
#include "ring/registry.h"
#include "copy/lease.h"
#include "values/target.h"
#endif

#include "convert/dtypes.h"
#include "ops/cache_index_checks.h"
#include "ops/write_cache_indices.h"

namespace pinstage {
namespace {

// The prefix tensors' addresses and lengths, taken from the tensors (checked, never read).
struct PrefixTable {
  std::vector<uint64_t> pointers;
  std::vector<int64_t> numels;
};

PrefixTable prefix_table(at::TensorList prefix_tensors, int64_t batch, const at::Device& device) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(prefix_tensors.size()) == batch, kOp, ": prefix_tensors has ",
                    prefix_tensors.size(), " entries but req_pool_indices has ", batch);
  PrefixTable table;
  table.pointers.reserve(static_cast<size_t>(batch));
  table.numels.reserve(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const at::Tensor& t = prefix_tensors[static_cast<size_t>(i)];
    check_prefix_tensor(i, t, device);
    table.pointers.push_back(reinterpret_cast<uintptr_t>(t.const_data_ptr()));
    table.numels.push_back(t.numel());
  }
  return table;
}

// Checks every argument's dtype, shape and device (per-request tensors may be on the CPU for the
// CUDA op, `cpu_too`), fills what does not depend on where the per-request values are, and takes
// the prefix table.
std::pair<CacheIndexParams, PrefixTable> checked_params(const at::Tensor& req_to_token,
                                                        const at::Tensor& req_pool_indices,
                                                        at::TensorList prefix_tensors, const at::Tensor& prefix_lens,
                                                        const at::Tensor& seq_lens,
                                                        const std::optional<at::Tensor>& out_cache_offsets,
                                                        const at::Tensor& out_cache_loc, bool cpu_too) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  const int64_t batch = req_pool_indices.numel();
  TORCH_CHECK_VALUE(batch <= INT32_MAX, kOp, ": at most 2**31 - 1 requests per call, got ", batch);
  check_per_request(req_pool_indices, "req_pool_indices", at::kLong, batch, device, cpu_too);
  check_per_request(prefix_lens, "prefix_lens", at::kLong, batch, device, cpu_too);
  check_per_request(seq_lens, "seq_lens", at::kLong, batch, device, cpu_too);
  if (out_cache_offsets) {
    check_per_request(*out_cache_offsets, "out_cache_offsets", at::kLong, batch, device, cpu_too);
  } else {
    TORCH_CHECK_VALUE(req_pool_indices.is_cpu() && prefix_lens.is_cpu() && seq_lens.is_cpu(), kOp,
                      ": out_cache_offsets may be None only when the per-request values are CPU tensors (the "
                      "offsets are then computed from them on the host)");
  }
  check_out_cache_loc(out_cache_loc, device);
  CacheIndexParams p{};
  p.req_to_token = req_to_token.data_ptr<int32_t>();
  p.row_stride = req_to_token.stride(0);
  p.rows = req_to_token.size(0);
  p.max_context_len = req_to_token.size(1);
  p.batch = batch;
  p.out_cache_loc = out_cache_loc.const_data_ptr<int64_t>();
  p.out_cache_len = out_cache_loc.numel();
  return {p, prefix_table(prefix_tensors, batch, device)};
}

// Per-request values on the host: every request checked before anything is written (a bad request
// leaves req_to_token untouched), and where out_cache_offsets is None, the offsets computed (each
// request's extend span follows the previous one's) into `computed`, which must outlive p.
void check_on_host(CacheIndexParams& p, const PrefixTable& table, const at::Tensor& req_pool_indices,
                   const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                   const std::optional<at::Tensor>& out_cache_offsets, std::vector<int64_t>& computed) {
  p.req_pool_indices = req_pool_indices.const_data_ptr<int64_t>();
  p.prefix_lens = prefix_lens.const_data_ptr<int64_t>();
  p.seq_lens = seq_lens.const_data_ptr<int64_t>();
  if (!out_cache_offsets) computed.resize(static_cast<size_t>(p.batch));
  const int64_t* given = out_cache_offsets ? out_cache_offsets->const_data_ptr<int64_t>() : nullptr;
  int64_t running = 0;
  for (int64_t i = 0; i < p.batch; ++i) {
    check_request_span(i, p.req_pool_indices[i], p.prefix_lens[i], p.seq_lens[i], p.rows, p.max_context_len);
    // Bounds as subtractions that cannot overflow: 0 <= prefix <= seq was checked above.
    const int64_t extend_len = p.seq_lens[i] - p.prefix_lens[i];
    const int64_t offset = given != nullptr ? given[i] : running;
    // Computed offsets lie inside out_cache_loc once they add up to its length (checked below).
    TORCH_CHECK_VALUE(given == nullptr || (offset >= 0 && offset <= p.out_cache_len &&
                                           extend_len <= p.out_cache_len - offset),
                      kOp, ": request ", i, ": out_cache_offsets is ", offset, " with ", extend_len,
                      " new tokens, outside out_cache_loc (", p.out_cache_len, " elements)");
    TORCH_CHECK_VALUE(p.prefix_lens[i] <= table.numels[static_cast<size_t>(i)], kOp, ": request ", i,
                      ": prefix_tensors entry has ", table.numels[static_cast<size_t>(i)],
                      " elements but prefix_lens is ", p.prefix_lens[i]);
    if (given == nullptr) {
      computed[static_cast<size_t>(i)] = offset;
      TORCH_CHECK_VALUE(!__builtin_add_overflow(running, extend_len, &running), kOp,
                        ": extend_lens add up to more than 2**63");
    }
  }
  TORCH_CHECK_VALUE(given != nullptr || running == p.out_cache_len, kOp, ": extend_lens add up to ", running,
                    " but out_cache_loc has ", p.out_cache_len, " elements");
  p.out_cache_offsets = given != nullptr ? given : computed.data();
}

// Everything on the CPU and checked (check_on_host).
void write_on_cpu(const CacheIndexParams& p, const PrefixTable& table) {
  for (int64_t i = 0; i < p.batch; ++i) {
    int32_t* dst = p.req_to_token + p.req_pool_indices[i] * p.row_stride;
    const auto* cached = reinterpret_cast<const int64_t*>(table.pointers[static_cast<size_t>(i)]);
    for (int64_t pos = 0; pos < p.prefix_lens[i]; ++pos) dst[pos] = static_cast<int32_t>(cached[pos]);
    const int64_t* extend = p.out_cache_loc + p.out_cache_offsets[i];
    for (int64_t pos = p.prefix_lens[i]; pos < p.seq_lens[i]; ++pos) {
      dst[pos] = static_cast<int32_t>(extend[pos - p.prefix_lens[i]]);
    }
  }
}

#ifdef PINSTAGE_WITH_CUDA
// Device values stay on the device (reading them would make the host wait): cache_index_plan
// checked them before they were staged, and the kernel skips rows out of bounds. The prefix table,
// and the per-request values on the host (offsets computed by check_on_host among them), go to the
// device in ONE copy through the staging ring.
void write_on_cuda(CacheIndexParams& p, const PrefixTable& table, const at::Tensor& req_to_token,
                   const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                   const std::optional<at::Tensor>& out_cache_offsets) {
  if (p.batch == 0) return;
  const c10::cuda::CUDAGuard guard(req_to_token.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(req_to_token.device().index());
  // A captured copy would read ring memory reused long before the graph replays.
  check_not_capturing(stream, kOp);
  // Where each array comes from, and where the kernel reads it.
  const size_t column_bytes = static_cast<size_t>(p.batch) * sizeof(int64_t);
  const size_t slot = align_up(column_bytes, kStagingAlignment);
  struct Column {
    const void* host;
    const at::Tensor* device;
    const int64_t** param;
  };
  const int64_t* pointers_param = nullptr;
  Column columns[] = {
      {table.pointers.data(), nullptr, &pointers_param},
      {table.numels.data(), nullptr, &p.prefix_numels},
      {nullptr, &req_pool_indices, &p.req_pool_indices},
      {nullptr, &prefix_lens, &p.prefix_lens},
      {nullptr, &seq_lens, &p.seq_lens},
      // None: the offsets check_on_host computed.
      {out_cache_offsets ? nullptr : p.out_cache_offsets, out_cache_offsets ? &*out_cache_offsets : nullptr,
       &p.out_cache_offsets},
  };
  size_t total = 0;
  for (Column& c : columns) {
    if (c.device != nullptr && c.device->is_cpu()) c.host = c.device->const_data_ptr();
    if (c.host != nullptr) total += slot;
  }
  const at::Tensor staged =
      at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte).device(req_to_token.device()));
  auto write = [&](uint8_t* region) -> size_t {
    size_t offset = 0;
    for (Column& c : columns) {
      if (c.host == nullptr) {
        *c.param = c.device->const_data_ptr<int64_t>();
        continue;
      }
      std::memcpy(region + offset, c.host, column_bytes);
      *c.param = reinterpret_cast<const int64_t*>(staged.const_data_ptr<uint8_t>() + offset);
      offset += slot;
    }
    return 0;
  };
  copy_through_ring(req_to_token.device().index(), total, stream.stream(), write,
                    [&]() -> void* { return staged.mutable_data_ptr(); });
  p.prefix_pointers = reinterpret_cast<const uint64_t*>(pointers_param);
  launch_write_cache_indices(p, stream.stream());
}
#endif

// The op's CPU and CUDA kernel: one set of checks, then the loop or the kernel for req_to_token's
// device. Per-request values on the CPU are checked on the host (all of them, for the CPU op).
void write_cache_indices(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                         at::TensorList prefix_tensors, const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                         const std::optional<at::Tensor>& out_cache_offsets, const at::Tensor& out_cache_loc) {
  const bool on_cuda = req_to_token.is_cuda();
  auto checked = checked_params(req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens,
                                out_cache_offsets, out_cache_loc, /*cpu_too=*/on_cuda);
  CacheIndexParams& p = checked.first;
  const bool host_values = req_pool_indices.is_cpu() && prefix_lens.is_cpu() && seq_lens.is_cpu() &&
                           (!out_cache_offsets || out_cache_offsets->is_cpu());
  std::vector<int64_t> computed_offsets;
  if (host_values) check_on_host(p, checked.second, req_pool_indices, prefix_lens, seq_lens, out_cache_offsets,
                                 computed_offsets);
  if (!on_cuda) {
    write_on_cpu(p, checked.second);
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  write_on_cuda(p, checked.second, req_to_token, req_pool_indices, prefix_lens, seq_lens, out_cache_offsets);
#endif
}

// Fake tensors (torch.compile's tracing) write nothing. A meta tensor among real ones also lands
// here (Meta outranks CPU and CUDA in dispatch): refused, as the real kernels refuse it.
void write_cache_indices_fake(const at::Tensor& req_to_token, const at::Tensor&, at::TensorList prefix_tensors,
                              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              const at::Tensor& out_cache_loc) {
  check_out_cache_loc(out_cache_loc, req_to_token.device());
  for (size_t i = 0; i < prefix_tensors.size(); ++i) {
    check_prefix_device(static_cast<int64_t>(i), prefix_tensors[i], req_to_token.device());
  }
}

}  // namespace
}  // namespace pinstage

TORCH_LIBRARY_IMPL(pinstage, CPU, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices); }

#ifdef PINSTAGE_WITH_CUDA
TORCH_LIBRARY_IMPL(pinstage, CUDA, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices); }
#endif

TORCH_LIBRARY_IMPL(pinstage, Meta, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_fake); }

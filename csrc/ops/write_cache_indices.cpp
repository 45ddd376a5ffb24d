// write_cache_indices as a torch custom op: one kernel for CPU and CUDA, and a no-op for fake
// tensors (it only writes into req_to_token). The per-request tensors are on req_to_token's device;
// for the CUDA op they may also be CPU tensors, checked on the host and copied with the prefix
// table in the op's one copy. cache_index_plan, the host checks alone, is here too.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ring/options.h"
#include "ring/registry.h"
#include "copy/ring_copy.h"
#include "copy/target.h"
#endif

#include "convert/dtypes.h"
#include "convert/tensor_memory.h"
#include "ops/write_cache_indices.h"

namespace pinstage {
namespace {

// ----------------------------------------------------------------------------- argument checks

constexpr const char* kOp = "write_cache_indices";

void check_req_to_token(const at::Tensor& req_to_token) {
  TORCH_CHECK_TYPE(req_to_token.scalar_type() == at::kInt, kOp, ": req_to_token must be torch.int32, got ",
                   dtype_name(req_to_token.scalar_type()));
  TORCH_CHECK_VALUE(req_to_token.dim() == 2, kOp, ": req_to_token must be 2-D [rows, max_context_len], got shape ",
                    req_to_token.sizes());
  TORCH_CHECK_VALUE(req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1, kOp,
                    ": req_to_token's rows must be contiguous (stride(1) == 1), got strides ", req_to_token.strides());
}

void check_out_cache_loc(const at::Tensor& out_cache_loc, const at::Device& device) {
  TORCH_CHECK_TYPE(out_cache_loc.scalar_type() == at::kLong, kOp, ": out_cache_loc must be torch.int64, got ",
                   dtype_name(out_cache_loc.scalar_type()));
  TORCH_CHECK_VALUE(out_cache_loc.dim() == 1 && out_cache_loc.is_contiguous(), kOp,
                    ": out_cache_loc must be a contiguous 1-D tensor, got shape ", out_cache_loc.sizes(), " strides ",
                    out_cache_loc.strides());
  TORCH_CHECK_VALUE(out_cache_loc.device() == device, kOp, ": out_cache_loc is on ", out_cache_loc.device(),
                    " but req_to_token is on ", device);
}

// One value per request: a contiguous 1-D tensor of `batch` elements of `dtype` on `device` (or on
// the CPU where `cpu_too`: the CUDA op copies those itself).
void check_per_request(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t batch,
                              const at::Device& device, bool cpu_too = false) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, kOp, ": ", name, " must be ", dtype_name(dtype), ", got ",
                   dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() == batch && t.is_contiguous(), kOp, ": ", name,
                    " must be a contiguous 1-D tensor of ", batch, " elements (one per request), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device || (cpu_too && t.is_cpu()), kOp, ": ", name, " is on ", t.device(),
                    " but req_to_token is on ", device);
}

// An empty prefix (a request without a cached one) is never read: any device will do, as SGLang
// passes one empty CPU tensor for all of them. A meta tensor among real ones routes the call to the
// op's fake kernel, which refuses it by this same check.
void check_prefix_device(int64_t i, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device || (t.numel() == 0 && !t.is_meta()), kOp, ": request ", i,
                    ": prefix_tensors entry is on ", t.device(), " but req_to_token is on ", device);
}

// Request i's cached prefix, whose address the op takes: an int64 1-D tensor on `device` with real
// memory of its own (a wrapper subclass or a fake tensor has a Python dispatch key and often a null
// data pointer; the kernel would read address 0). Checks metadata only, never values.
void check_prefix_tensor(int64_t i, const at::Tensor& t, const at::Device& device) {
  check_prefix_device(i, t, device);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, kOp, ": request ", i,
                   ": prefix_tensors entry must be torch.int64, got ", dtype_name(t.scalar_type()));
  TORCH_CHECK_TYPE(has_real_memory(t), kOp, ": request ", i,
                   ": prefix_tensors entry has no memory of its own (a tensor subclass wrapping others, a fake or "
                   "zero tensor); pass the tensor that holds the slots");
  TORCH_CHECK_VALUE(t.dim() == 1, kOp, ": request ", i, ": prefix_tensors entry must be 1-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.numel() <= 1 || t.stride(0) == 1, kOp, ": request ", i,
                    ": prefix_tensors entry must be contiguous, got stride ", t.stride(0));
}

// One request's row and its [0, prefix_len) + [prefix_len, seq_len) span of that row.
void check_request_span(int64_t i, int64_t row, int64_t prefix_len, int64_t seq_len, int64_t rows,
                        int64_t max_context_len) {
  TORCH_CHECK_INDEX(row >= 0 && row < rows, kOp, ": request ", i, ": req_pool_indices is ", row,
                    ", outside req_to_token's ", rows, " rows");
  TORCH_CHECK_VALUE(prefix_len >= 0, kOp, ": request ", i, ": prefix_lens is negative (", prefix_len, ")");
  TORCH_CHECK_VALUE(seq_len >= prefix_len, kOp, ": request ", i, ": seq_lens (", seq_len, ") < prefix_lens (",
                    prefix_len, ")");
  TORCH_CHECK_VALUE(seq_len <= max_context_len, kOp, ": request ", i, ": seq_lens (", seq_len,
                    ") > req_to_token's max_context_len (", max_context_len, ")");
}

// ----------------------------------------------------------------------------- the op

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
                                                        const at::Tensor& out_cache_loc,
                                                        const std::optional<at::Tensor>& extend_lens, bool cpu_too) {
  check_req_to_token(req_to_token);
  const at::Device device = req_to_token.device();
  const int64_t batch = req_pool_indices.numel();
  TORCH_CHECK_VALUE(batch <= INT32_MAX, kOp, ": at most 2**31 - 1 requests per call, got ", batch);
  const std::pair<const char*, const at::Tensor*> per_request[] = {
      {"prefix_lens", &prefix_lens}, {"seq_lens", &seq_lens},
      {"extend_lens", extend_lens ? &*extend_lens : nullptr},
      {"out_cache_offsets", out_cache_offsets ? &*out_cache_offsets : nullptr}};
  for (const auto& [name, t] : per_request) {
    TORCH_CHECK_VALUE(t == nullptr || t->numel() == batch, kOp, ": ", name, " has ", t ? t->numel() : 0,
                      " entries but req_pool_indices has ", batch);
  }
  if (extend_lens) check_per_request(*extend_lens, "extend_lens", at::kLong, batch, at::Device(at::kCPU));
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
// leaves req_to_token untouched), extend_lens (where given) against seq_lens - prefix_lens, and where
// out_cache_offsets is None, the offsets computed (each request's new tokens follow the previous
// one's) into `computed`, which must outlive p. The host plan (cache_index_plan) is this and no more.
void check_on_host(CacheIndexParams& p, const PrefixTable& table, const at::Tensor& req_pool_indices,
                   const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                   const std::optional<at::Tensor>& out_cache_offsets, const std::optional<at::Tensor>& extend_lens,
                   std::vector<int64_t>& computed) {
  p.req_pool_indices = req_pool_indices.const_data_ptr<int64_t>();
  p.prefix_lens = prefix_lens.const_data_ptr<int64_t>();
  p.seq_lens = seq_lens.const_data_ptr<int64_t>();
  if (!out_cache_offsets) computed.resize(static_cast<size_t>(p.batch));
  const int64_t* given = out_cache_offsets ? out_cache_offsets->const_data_ptr<int64_t>() : nullptr;
  const int64_t* extend = extend_lens ? extend_lens->const_data_ptr<int64_t>() : nullptr;
  int64_t running = 0;
  for (int64_t i = 0; i < p.batch; ++i) {
    check_request_span(i, p.req_pool_indices[i], p.prefix_lens[i], p.seq_lens[i], p.rows, p.max_context_len);
    // Bounds as subtractions that cannot overflow: 0 <= prefix <= seq was checked above.
    const int64_t extend_len = p.seq_lens[i] - p.prefix_lens[i];
    TORCH_CHECK_VALUE(extend == nullptr || extend[i] == extend_len, kOp, ": request ", i, ": extend_lens (",
                      extend ? extend[i] : 0, ") != seq_lens - prefix_lens (", p.seq_lens[i], " - ", p.prefix_lens[i],
                      ")");
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
                         const std::optional<at::Tensor>& out_cache_offsets, const at::Tensor& out_cache_loc,
                         const std::optional<at::Tensor>& extend_lens) {
  const bool on_cuda = req_to_token.is_cuda();
  auto checked = checked_params(req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens,
                                out_cache_offsets, out_cache_loc, extend_lens, /*cpu_too=*/on_cuda);
  CacheIndexParams& p = checked.first;
  const bool host_values = req_pool_indices.is_cpu() && prefix_lens.is_cpu() && seq_lens.is_cpu() &&
                           (!out_cache_offsets || out_cache_offsets->is_cpu());
  TORCH_CHECK_VALUE(host_values || !extend_lens, kOp, ": extend_lens is checked on the host: pass it with the "
                    "per-request values on the CPU");
  std::vector<int64_t> computed_offsets;
  if (host_values) check_on_host(p, checked.second, req_pool_indices, prefix_lens, seq_lens, out_cache_offsets,
                                 extend_lens, computed_offsets);
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
                              const at::Tensor& out_cache_loc, const std::optional<at::Tensor>&) {
  check_out_cache_loc(out_cache_loc, req_to_token.device());
  for (size_t i = 0; i < prefix_tensors.size(); ++i) {
    check_prefix_device(static_cast<int64_t>(i), prefix_tensors[i], req_to_token.device());
  }
}

// The host plan for values that will be staged before the op (the benchmarks' other backends): the
// op's own host checks, extend_lens among them, and the offsets it would compute, as a CPU tensor.
// It never reads device memory, so one kernel serves req_to_token on any device.
at::Tensor cache_index_plan(const at::Tensor& req_to_token, at::TensorList prefix_tensors,
                            const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                            const at::Tensor& seq_lens, const at::Tensor& extend_lens, const at::Tensor& out_cache_loc) {
  auto checked = checked_params(req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, std::nullopt,
                                out_cache_loc, extend_lens, /*cpu_too=*/true);
  std::vector<int64_t> offsets;
  check_on_host(checked.first, checked.second, req_pool_indices, prefix_lens, seq_lens, std::nullopt, extend_lens,
                offsets);
  at::Tensor out = at::empty({static_cast<int64_t>(offsets.size())}, at::TensorOptions().dtype(at::kLong));
  if (!offsets.empty()) std::memcpy(out.data_ptr<int64_t>(), offsets.data(), offsets.size() * sizeof(int64_t));
  return out;
}

}  // namespace
}  // namespace pinstage

TORCH_LIBRARY_IMPL(pinstage, CPU, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices); }

#ifdef PINSTAGE_WITH_CUDA
TORCH_LIBRARY_IMPL(pinstage, CUDA, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices); }
#endif

TORCH_LIBRARY_IMPL(pinstage, Meta, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_fake); }

TORCH_LIBRARY_IMPL(pinstage, CompositeExplicitAutograd, m) { m.impl("cache_index_plan", &pinstage::cache_index_plan); }

// write_cache_indices as a torch custom op: one kernel for CPU and CUDA, and a no-op for fake
// tensors (it only writes into req_to_token). The per-request tensors are on req_to_token's device;
// for the CUDA op they may also be CPU tensors, checked on the host and read by the kernel from one
// ring region with the prefix table.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "copy/ring_copy.h"
#include "copy/target.h"
#include "ring/options.h"
#include "ring/registry.h"
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

// A tensor the kernel reads or writes through its address: its bytes must be its values. torch's
// dispatcher settles a fake or wrapper tensor and a negative view before the op's kernel runs; the
// builder's direct call (bindings/module.cpp) does not go through it.
void check_values_in_memory(const at::Tensor& t, const char* what) {
  TORCH_CHECK_TYPE(has_real_memory(t), kOp, ": ", what,
                   " has no memory of its own (a tensor subclass wrapping others, a fake or zero tensor)");
  TORCH_CHECK_VALUE(!t.is_neg(), kOp, ": ", what, " is a negative view; pass .resolve_neg()");
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
                    " must be a contiguous 1-D tensor of ", batch, " elements (one per request), got shape ",
                    t.sizes());
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
  TORCH_CHECK_VALUE(!t.is_neg(), kOp, ": request ", i,
                    ": prefix_tensors entry is a negative view; pass .resolve_neg()");
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

// ----------------------------------------------------------------------------- overlap

// [first byte, one past the last byte) that t's sizes and strides reach (torch strides are >= 0).
std::pair<uintptr_t, uintptr_t> byte_range(const at::Tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  uintptr_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += static_cast<uintptr_t>((t.size(d) - 1) * t.stride(d));
  return {begin, begin + (last + 1) * t.itemsize()};
}

// Whether two tensors may share memory. Apart in the address space, they cannot (the common case,
// answered without torch's test: the op asks once per request). Otherwise torch's test decides
// (exact for dense tensors of one storage); where it cannot tell (a strided req_to_token) or
// compares two storages over the same memory (views of one numpy buffer through from_numpy, which
// torch calls "No"), meeting address ranges count as sharing.
bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.device() != b.device() || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a_begin, a_end] = byte_range(a);
  const auto [b_begin, b_end] = byte_range(b);
  if (a_begin >= b_end || b_begin >= a_end) return false;
  switch (at::get_overlap_status(a, b)) {
    case at::MemOverlapStatus::Full:
    case at::MemOverlapStatus::Partial:
      return true;
    case at::MemOverlapStatus::No:
      return !a.storage().is_alias_of(b.storage());
    case at::MemOverlapStatus::TooHard:
      break;
  }
  return true;
}

// req_to_token is the op's output: its rows must not share memory with each other (a stride-0
// expansion would have every request write the same row) nor with anything the op reads (its
// writes would change values it has yet to read).
void check_no_overlap(const at::Tensor& req_to_token, PrefixRefs prefix_tensors,
                      std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs) {
  const bool rows_disjoint = req_to_token.size(0) <= 1 || req_to_token.stride(0) >= req_to_token.size(1);
  TORCH_CHECK(at::has_internal_overlap(req_to_token) != at::MemOverlap::Yes && rows_disjoint, kOp,
              ": req_to_token's rows share memory (shape ", req_to_token.sizes(), ", strides ", req_to_token.strides(),
              "); pass a tensor whose rows have memory of their own (e.g. .contiguous())");
  for (const auto& [name, t] : inputs) {
    TORCH_CHECK(t == nullptr || !may_overlap(req_to_token, *t), kOp, ": req_to_token overlaps ", name,
                " in memory; the op writes req_to_token, so pass ", name, " in memory of its own (e.g. .clone())");
  }
  for (size_t i = 0; i < prefix_tensors.size(); ++i) {
    TORCH_CHECK(!may_overlap(req_to_token, *prefix_tensors[i]), kOp, ": request ", i,
                ": req_to_token overlaps its prefix_tensors entry in memory; the op writes req_to_token, so pass "
                "the prefix in memory of its own (e.g. .clone())");
  }
}

// ----------------------------------------------------------------------------- the op

PrefixTable prefix_table(PrefixRefs prefix_tensors, int64_t batch, const at::Device& device) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(prefix_tensors.size()) == batch, kOp, ": prefix_tensors has ",
                    prefix_tensors.size(), " entries but req_pool_indices has ", batch);
  PrefixTable table;
  table.pointers.reserve(static_cast<size_t>(batch));
  table.numels.reserve(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const at::Tensor& t = *prefix_tensors[static_cast<size_t>(i)];
    check_prefix_tensor(i, t, device);
    table.pointers.push_back(reinterpret_cast<uintptr_t>(t.const_data_ptr()));
    table.numels.push_back(t.numel());
  }
  return table;
}

// req_to_token (the output) and the number of requests, checked; out_cache_loc's address is set
// by the caller once it has checked that tensor.
CacheIndexParams checked_target(const at::Tensor& req_to_token, int64_t batch, int64_t out_cache_len) {
  check_values_in_memory(req_to_token, "req_to_token");
  check_req_to_token(req_to_token);
  TORCH_CHECK_VALUE(batch <= INT32_MAX, kOp, ": at most 2**31 - 1 requests per call, got ", batch);
  CacheIndexParams p{};
  p.req_to_token = req_to_token.data_ptr<int32_t>();
  p.row_stride = req_to_token.stride(0);
  p.rows = req_to_token.size(0);
  p.max_context_len = req_to_token.size(1);
  p.batch = batch;
  p.out_cache_len = out_cache_len;
  return p;
}

void check_out_cache_loc_tensor(const at::Tensor& out_cache_loc, const at::Device& device) {
  check_values_in_memory(out_cache_loc, "out_cache_loc");
  check_out_cache_loc(out_cache_loc, device);
}

// What both entries check and fill: req_to_token (the output) and out_cache_loc, and the number of
// requests.
CacheIndexParams checked_target(const at::Tensor& req_to_token, const at::Tensor& out_cache_loc, int64_t batch) {
  check_values_in_memory(req_to_token, "req_to_token");  // both tensors' memory first
  check_values_in_memory(out_cache_loc, "out_cache_loc");
  CacheIndexParams p = checked_target(req_to_token, batch, out_cache_loc.numel());
  check_out_cache_loc(out_cache_loc, req_to_token.device());
  p.out_cache_loc = out_cache_loc.const_data_ptr<int64_t>();
  return p;
}

// The op's per-request tensors: dtype, shape, device (the CPU too for the CUDA op, `cpu_too`) and
// memory, and that out_cache_offsets is given unless the values are on the host.
void check_request_tensors(const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& seq_lens, const at::Tensor* offsets, const at::Tensor* extend,
                           const at::Device& device, bool cpu_too) {
  const int64_t batch = req_pool_indices.numel();
  const std::pair<const char*, const at::Tensor*> per_request[] = {{"req_pool_indices", &req_pool_indices},
                                                                   {"prefix_lens", &prefix_lens},
                                                                   {"seq_lens", &seq_lens},
                                                                   {"extend_lens", extend},
                                                                   {"out_cache_offsets", offsets}};
  for (const auto& [name, t] : per_request) {
    if (t != nullptr) check_values_in_memory(*t, name);
  }
  for (const auto& [name, t] : per_request) {
    TORCH_CHECK_VALUE(t == nullptr || t->numel() == batch, kOp, ": ", name, " has ", t ? t->numel() : 0,
                      " entries but req_pool_indices has ", batch);
  }
  if (extend) check_per_request(*extend, "extend_lens", at::kLong, batch, at::Device(at::kCPU));
  check_per_request(req_pool_indices, "req_pool_indices", at::kLong, batch, device, cpu_too);
  check_per_request(prefix_lens, "prefix_lens", at::kLong, batch, device, cpu_too);
  check_per_request(seq_lens, "seq_lens", at::kLong, batch, device, cpu_too);
  if (offsets) {
    check_per_request(*offsets, "out_cache_offsets", at::kLong, batch, device, cpu_too);
  } else {
    TORCH_CHECK_VALUE(req_pool_indices.is_cpu() && prefix_lens.is_cpu() && seq_lens.is_cpu(), kOp,
                      ": out_cache_offsets may be None only when the per-request values are CPU tensors (the "
                      "offsets are then computed from them on the host)");
  }
}

std::vector<int64_t> copy_of(const at::Tensor* t) {
  std::vector<int64_t> out(t != nullptr ? static_cast<size_t>(t->numel()) : 0);
  if (!out.empty()) std::memcpy(out.data(), t->const_data_ptr<int64_t>(), out.size() * sizeof(int64_t));
  return out;
}

// Every request checked on the copies before anything is written (a bad request leaves
// req_to_token untouched), extend_lens (where given) against seq_lens - prefix_lens, and where no
// out_cache_offsets were given, the offsets computed (each request's new tokens follow the previous
// one's). Points p at the copies, which must outlive it.
void check_on_host(CacheIndexParams& p, const PrefixTable& table, RequestValues& v, bool given) {
  if (!given) v.offsets.resize(static_cast<size_t>(p.batch));
  int64_t running = 0;
  for (size_t i = 0; i < static_cast<size_t>(p.batch); ++i) {
    const int64_t prefix_len = v.prefix_lens[i];
    const int64_t seq_len = v.seq_lens[i];
    check_request_span(static_cast<int64_t>(i), v.rows[i], prefix_len, seq_len, p.rows, p.max_context_len);
    // Bounds as subtractions that cannot overflow: 0 <= prefix <= seq was checked above.
    const int64_t extend_len = seq_len - prefix_len;
    TORCH_CHECK_VALUE(v.extend_lens.empty() || v.extend_lens[i] == extend_len, kOp, ": request ", i, ": extend_lens (",
                      v.extend_lens.empty() ? 0 : v.extend_lens[i], ") != seq_lens - prefix_lens (", seq_len, " - ",
                      prefix_len, ")");
    TORCH_CHECK_VALUE(prefix_len <= table.numels[i], kOp, ": request ", i, ": prefix_tensors entry has ",
                      table.numels[i], " elements but prefix_lens is ", prefix_len);
    if (given) {
      const int64_t offset = v.offsets[i];
      TORCH_CHECK_VALUE(offset >= 0 && offset <= p.out_cache_len && extend_len <= p.out_cache_len - offset, kOp,
                        ": request ", i, ": out_cache_offsets is ", offset, " with ", extend_len,
                        " new tokens, outside out_cache_loc (", p.out_cache_len, " elements)");
      continue;
    }
    // Computed offsets lie inside out_cache_loc once they add up to its length (checked below).
    v.offsets[i] = running;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(running, extend_len, &running), kOp,
                      ": extend_lens add up to more than 2**63 - 1 at request ", i);
  }
  TORCH_CHECK_VALUE(given || running == p.out_cache_len, kOp, ": extend_lens add up to ", running,
                    " but out_cache_loc has ", p.out_cache_len, " elements");
  p.req_pool_indices = v.rows.data();
  p.prefix_lens = v.prefix_lens.data();
  p.seq_lens = v.seq_lens.data();
  p.out_cache_offsets = v.offsets.data();
}

// Everything on the CPU and checked (check_on_host): the loop reads only the op's copies, the
// prefix tensors and out_cache_loc, within the bounds checked on the copies.
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
// Where the kernel reads its six per-request arrays. Device values stay on the device (reading them
// would make the host wait): the kernel reads them on the stream and skips rows out of bounds. The
// prefix table, and the values on the host (the op's checked copies, else a CPU tensor among device
// ones, read once here), go into ring memory that the kernel reads in place (pinned memory is mapped
// under unified addressing): no copy and no device scratch.
// `tensors`: rows, prefix_lens, seq_lens and offsets as tensors, read only where `checked` is null.
class KernelColumns {
 public:
  static constexpr size_t kCount = 6;

  KernelColumns(CacheIndexParams& p, const PrefixTable& table, const RequestValues* checked,
                std::array<const at::Tensor*, 4> tensors)
      : p_(p),
        column_bytes_(static_cast<size_t>(p.batch) * sizeof(int64_t)),
        columns_{{
            {table.pointers.data(), nullptr, &pointers_},
            {table.numels.data(), nullptr, &p.prefix_numels},
            {checked ? checked->rows.data() : nullptr, tensors[0], &p.req_pool_indices},
            {checked ? checked->prefix_lens.data() : nullptr, tensors[1], &p.prefix_lens},
            {checked ? checked->seq_lens.data() : nullptr, tensors[2], &p.seq_lens},
            // Checked on the host: the offsets given or computed.
            {checked ? checked->offsets.data() : nullptr, tensors[3], &p.out_cache_offsets},
        }} {
    for (Column& c : columns_) {
      c.on_host = c.device == nullptr || c.device->is_cpu();
      if (c.device != nullptr && c.on_host) c.host = c.device->const_data_ptr();
      if (c.on_host) ring_bytes_ += slot(p.batch);
    }
  }

  // Ring bytes for one array of `batch` requests, and for all of them on the host.
  static size_t slot(int64_t batch) {
    return align_up(static_cast<size_t>(batch) * sizeof(int64_t), kStagingAlignment);
  }
  static size_t host_ring_bytes(int64_t batch) { return kCount * slot(batch); }
  size_t ring_bytes() const { return ring_bytes_; }

  // Writes the host arrays at `region` (ring_bytes() of ring memory) and points the params at them.
  void place(uint8_t* region) {
    size_t offset = 0;
    for (Column& c : columns_) {
      if (!c.on_host) {
        *c.param = c.device->const_data_ptr<int64_t>();
        continue;
      }
      if (column_bytes_ > 0) std::memcpy(region + offset, c.host, column_bytes_);
      *c.param = reinterpret_cast<const int64_t*>(region + offset);
      offset += slot(p_.batch);
    }
    p_.prefix_pointers = reinterpret_cast<const uint64_t*>(pointers_);
  }

 private:
  struct Column {
    const void* host;  // the checked values (null where there are none), else a CPU tensor's
    const at::Tensor* device;
    const int64_t** param;
    bool on_host = false;
  };
  CacheIndexParams& p_;
  const int64_t* pointers_ = nullptr;
  size_t column_bytes_;
  std::array<Column, kCount> columns_;
  size_t ring_bytes_ = 0;
};

// The kernel on req_to_token's current stream, its host arrays in a ring region of their own,
// sealed behind it. `held`, where given, runs once the region is held: under on_full="wait"
// getting it may release the GIL, and another thread may then change what was checked.
void write_on_cuda(CacheIndexParams& p, const PrefixTable& table, const RequestValues* checked,
                   const at::Tensor& req_to_token, std::array<const at::Tensor*, 4> tensors,
                   const std::function<void()>& held = nullptr) {
  if (p.batch == 0) return;
  const c10::cuda::CUDAGuard guard(req_to_token.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(req_to_token.device().index());
  // A captured kernel would read ring memory reused long before the graph replays.
  check_not_capturing(stream, kOp);
  KernelColumns columns(p, table, checked, tensors);
  StagingRing& ring = ring_for(req_to_token.device().index(), Direction::kToDevice);
  LeaseGuard lease(ring, columns.ring_bytes());
  if (held) held();  // an error abandons the region: nothing read it
  columns.place(lease.data());
  const int launched = launch_write_cache_indices(p, StagedCopy{}, stream.stream());
  // Sealed behind the kernel whether or not it was launched (a failed launch reads nothing).
  lease.commit(stream.stream());
  C10_CUDA_CHECK(static_cast<cudaError_t>(launched));
  ring.counters().record(columns.ring_bytes(), 0, 0);
}
#endif

// Values on the host: every request checked before anything is written, then the loop or the kernel.
void write_checked(CacheIndexParams& p, const PrefixTable& table, RequestValues& values, bool offsets_given,
                   const at::Tensor& req_to_token) {
  check_on_host(p, table, values, offsets_given);
  if (!req_to_token.is_cuda()) {
    write_on_cpu(p, table);
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  write_on_cuda(p, table, &values, req_to_token, {});
#endif
}

}  // namespace

// One set of checks, then the loop or the kernel for req_to_token's device. Per-request values on
// the CPU are copied and checked on the host (all of them, for the CPU op).
void write_cache_indices(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, PrefixRefs prefix_tensors,
                         const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                         const std::optional<at::Tensor>& out_cache_offsets, const at::Tensor& out_cache_loc,
                         const std::optional<at::Tensor>& extend_lens) {
  const at::Tensor* offsets = out_cache_offsets ? &*out_cache_offsets : nullptr;
  const at::Tensor* extend = extend_lens ? &*extend_lens : nullptr;
  check_request_tensors(req_pool_indices, prefix_lens, seq_lens, offsets, extend, req_to_token.device(),
                        /*cpu_too=*/req_to_token.is_cuda());
  CacheIndexParams p = checked_target(req_to_token, out_cache_loc, req_pool_indices.numel());
  const PrefixTable table = prefix_table(prefix_tensors, p.batch, req_to_token.device());
  check_no_overlap(req_to_token, prefix_tensors,
                   {{"req_pool_indices", &req_pool_indices},
                    {"prefix_lens", &prefix_lens},
                    {"seq_lens", &seq_lens},
                    {"out_cache_offsets", offsets},
                    {"extend_lens", extend},
                    {"out_cache_loc", &out_cache_loc}});
  const bool host_values =
      req_pool_indices.is_cpu() && prefix_lens.is_cpu() && seq_lens.is_cpu() && (!offsets || offsets->is_cpu());
  if (host_values) {
    RequestValues values{copy_of(&req_pool_indices), copy_of(&prefix_lens), copy_of(&seq_lens), copy_of(offsets),
                         copy_of(extend)};
    write_checked(p, table, values, offsets != nullptr, req_to_token);
    return;
  }
  TORCH_CHECK_VALUE(!extend, kOp,
                    ": extend_lens is checked on the host: pass it with the per-request values on the CPU");
#ifdef PINSTAGE_WITH_CUDA
  // Device values exist only for a CUDA req_to_token (check_request_tensors).
  write_on_cuda(p, table, nullptr, req_to_token, {&req_pool_indices, &prefix_lens, &seq_lens, offsets});
#endif
}

namespace {

// The lists' lengths against req_pool_indices' (the number of requests), and no offsets given.
int64_t checked_list_lengths(const RequestValues& values) {
  const int64_t batch = static_cast<int64_t>(values.rows.size());
  const std::pair<const char*, size_t> per_request[] = {{"prefix_lens", values.prefix_lens.size()},
                                                        {"seq_lens", values.seq_lens.size()},
                                                        {"extend_lens", values.extend_lens.size()}};
  for (const auto& [name, size] : per_request) {
    TORCH_CHECK_VALUE(static_cast<int64_t>(size) == batch, kOp, ": ", name, " has ", size,
                      " entries but req_pool_indices has ", batch);
  }
  TORCH_CHECK_VALUE(values.offsets.empty(), kOp, ": the offsets are computed from the lists");
  return batch;
}

}  // namespace

ListCacheWrite::ListCacheWrite(const at::Tensor& req_to_token, PrefixRefs prefix_tensors, int64_t out_cache_len,
                               RequestValues values, const at::Tensor* out_cache_loc)
    : req_to_token_(req_to_token), prefix_tensors_(prefix_tensors), values_(std::move(values)) {
  const int64_t batch = checked_list_lengths(values_);
  // In the op's order: the lists' lengths, then req_to_token and out_cache_loc where it exists.
  params_ = out_cache_loc ? checked_target(req_to_token, *out_cache_loc, batch)
                          : checked_target(req_to_token, batch, out_cache_len);
  table_ = prefix_table(prefix_tensors, batch, req_to_token.device());
  check_no_overlap(req_to_token, prefix_tensors, {});
  check_on_host(params_, table_, values_, /*given=*/false);
}

void ListCacheWrite::run(const at::Tensor& out_cache_loc) {
  check_out_cache_loc_tensor(out_cache_loc, req_to_token_.device());
  TORCH_CHECK_VALUE(out_cache_loc.numel() == params_.out_cache_len, kOp, ": extend_lens add up to ",
                    params_.out_cache_len, " but out_cache_loc has ", out_cache_loc.numel(), " elements");
  check_no_overlap(req_to_token_, {}, {{"out_cache_loc", &out_cache_loc}});
  params_.out_cache_loc = out_cache_loc.const_data_ptr<int64_t>();
  if (!req_to_token_.is_cuda()) {
    check_unchanged();
    write_on_cpu(params_, table_);
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  write_on_cuda(params_, table_, &values_, req_to_token_, {}, [this] { check_unchanged(); });
#endif
}

#ifdef PINSTAGE_WITH_CUDA
size_t ListCacheWrite::ring_bytes() const { return KernelColumns::host_ring_bytes(params_.batch); }

int ListCacheWrite::launch_with_copy(const int64_t* out_cache_loc, const StagedCopy& copy, uint8_t* columns,
                                     void* stream) {
  check_unchanged();
  KernelColumns placed(params_, table_, &values_, {});
  placed.place(columns);
  params_.out_cache_loc = out_cache_loc;
  return launch_write_cache_indices(params_, copy, stream);
}
#endif

void ListCacheWrite::check_unchanged() const {
  const at::Tensor& t = req_to_token_;
  const bool same_table = t.dim() == 2 && t.scalar_type() == at::kInt && t.data_ptr() == params_.req_to_token &&
                          t.size(0) == params_.rows && t.size(1) == params_.max_context_len &&
                          t.stride(0) == params_.row_stride && (t.size(1) <= 1 || t.stride(1) == 1) &&
                          storage_covers(t);  // a storage freed and remade smaller may reuse the address
  TORCH_CHECK(same_table, kOp,
              ": req_to_token changed after it was checked (Python code run meanwhile resized "
              "or replaced it); nothing was written");
  for (size_t i = 0; i < prefix_tensors_.size(); ++i) {
    const at::Tensor& prefix = *prefix_tensors_[i];
    // The kernel reads numel int64 slots from the address: a view as another 8-byte dtype, or a
    // stride, at the same address and length would be read as slots it does not hold.
    TORCH_CHECK(reinterpret_cast<uintptr_t>(prefix.const_data_ptr()) == table_.pointers[i] &&
                    prefix.numel() == table_.numels[i] && prefix.scalar_type() == at::kLong && prefix.dim() == 1 &&
                    (prefix.numel() <= 1 || prefix.stride(0) == 1) && storage_covers(prefix),
                kOp, ": request ", i, ": its prefix_tensors entry changed after it was checked; nothing was written");
  }
}

void write_cache_indices_of_lists(const at::Tensor& req_to_token, PrefixRefs prefix_tensors,
                                  const at::Tensor& out_cache_loc, RequestValues values) {
  ListCacheWrite(req_to_token, prefix_tensors, out_cache_loc.numel(), std::move(values), &out_cache_loc)
      .run(out_cache_loc);
}

namespace {

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

// The op's CPU and CUDA kernel: its list of prefix tensors, borrowed.
void write_cache_indices_op(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            at::TensorList prefix_tensors, const at::Tensor& prefix_lens, const at::Tensor& seq_lens,
                            const std::optional<at::Tensor>& out_cache_offsets, const at::Tensor& out_cache_loc,
                            const std::optional<at::Tensor>& extend_lens) {
  std::vector<const at::Tensor*> prefixes;
  prefixes.reserve(prefix_tensors.size());
  for (const at::Tensor& t : prefix_tensors) prefixes.push_back(&t);
  write_cache_indices(req_to_token, req_pool_indices, prefixes, prefix_lens, seq_lens, out_cache_offsets, out_cache_loc,
                      extend_lens);
}

}  // namespace
}  // namespace pinstage

TORCH_LIBRARY_IMPL(pinstage, CPU, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_op); }

#ifdef PINSTAGE_WITH_CUDA
TORCH_LIBRARY_IMPL(pinstage, CUDA, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_op); }
#endif

TORCH_LIBRARY_IMPL(pinstage, Meta, m) { m.impl("write_cache_indices", &pinstage::write_cache_indices_fake); }

#include "ops/stage_prefill.h"

#include <ATen/record_function.h>

#include <utility>

#include "convert/dtypes.h"
#include "ops/logprob_indices.h"
#include "tensor/stage.h"

namespace pinstage {
namespace {

constexpr const char* kApi = "builders.stage_prefill";  // messages add "pinstage."

// A host int64 array the call computed, staged as it is.
ItemPlan computed_plan(at::Tensor values) {
  ItemPlan plan;
  plan.dtype = at::kLong;
  plan.shape.assign(values.sizes().begin(), values.sizes().end());
  plan.numel = values.numel();
  plan.nbytes = static_cast<size_t>(plan.numel) * sizeof(int64_t);
  plan.source = ItemPlan::Source::kHeld;
  plan.tensor = std::move(values);
  return plan;
}

}  // namespace

std::vector<at::Tensor> stage_prefill(PyObject* items, std::vector<int64_t> extend_lens,
                                      const std::vector<int64_t>& logprob_starts, std::optional<PrefillCacheRows> cache,
                                      PyObject* stream, PyObject* device) {
  RECORD_USER_SCOPE("pinstage::stage_prefill");  // a range in the torch profiler
  check_items_sequence(items, kApi);
  const Target target = resolve_target(stream, device);
  std::vector<THPObjectPtr> held;
  std::vector<ItemPlan> plans = plan_many(items, kApi, held);  // the items' errors first
  const int64_t item_count = static_cast<int64_t>(plans.size());
  auto [sample, input_logprob, pruned_lens, kept_rows] = logprob_indices(extend_lens, logprob_starts);
  for (at::Tensor* t : {&sample, &input_logprob, &pruned_lens, &kept_rows})
    plans.push_back(computed_plan(std::move(*t)));
  std::optional<ListCacheWrite> cache_write;
  if (cache) {
    const int64_t k = cache->out_cache_loc_item;
    TORCH_CHECK_INDEX(k >= 0 && k < item_count, "pinstage.", kApi, ": out_cache_loc is item ", k, " but there are ",
                      item_count, " items");
    const ItemPlan& loc = plans[static_cast<size_t>(k)];
    // As write_cache_indices checks it, whatever form the columns take: the dtype a TypeError,
    // the shape a ValueError.
    TORCH_CHECK_TYPE(loc.dtype == at::kLong, "pinstage.", kApi, ": out_cache_loc (item ", k,
                     ") must be staged as torch.int64, got ", dtype_name(loc.dtype));
    TORCH_CHECK_VALUE(loc.shape.size() == 1, "pinstage.", kApi, ": out_cache_loc (item ", k,
                      ") must be 1-D (one slot per new token), got shape ", c10::IntArrayRef(loc.shape));
    const at::Tensor& table = *cache->req_to_token;
    TORCH_CHECK_VALUE(table.device() == target.device, "pinstage.", kApi, ": req_to_token is on ", table.device(),
                      " but the items are staged to ", target.device);
    cache->values.extend_lens = std::move(extend_lens);
    cache_write.emplace(table, cache->prefix_tensors, loc.numel, std::move(cache->values));
  }
  const size_t loc_item = static_cast<size_t>(cache ? cache->out_cache_loc_item : 0);
#ifdef PINSTAGE_WITH_CUDA
  if (cache_write && target.stream) {
    // One launch copies the items and writes the rows, reading out_cache_loc in the ring region
    // (above kBlocksCopyMaxBytes of items the copy engine copies them first).
    const KernelForCopy kernel{cache_write->ring_bytes(), [&](const uint8_t* region, const size_t* offsets,
                                                              size_t bytes, void* device, uint8_t* own, void* stream) {
                                 const auto* loc = reinterpret_cast<const int64_t*>(region + offsets[loc_item]);
                                 const StagedCopy copy{region, device, static_cast<int64_t>(bytes)};
                                 return cache_write->launch_with_copy(loc, copy, own, stream);
                               }};
    return stage_plans(plans, target, kApi, &kernel);
  }
#endif
  std::vector<at::Tensor> staged = stage_plans(plans, target, kApi);
  if (cache_write) cache_write->run(staged[loc_item]);  // on the CPU
  return staged;
}

}  // namespace pinstage

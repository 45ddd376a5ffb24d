// Sampling tensors and flags gathered from SamplingParams-like objects, with the Python builder's
// validation (temperature >= 0, 0 < top_p <= 1, top_k >= 1, 0 <= min_p <= 1) done on the same
// Python numbers: a request that fails it makes the gather decline, and the Python builder raises.
#include "native_builders.h"

#include <vector>

#include "../scalar_store.h"
#include "../stage.h"
#include "../target.h"
#include "py_fields.h"

namespace py = pybind11;

namespace pinstage::builders {
namespace {

// A float field: the Python number for the range check, and its float32 as torch.tensor makes it.
bool real_field(PyObject* params, FieldReader& reader, double* value, float* stored) {
  const Ref field = reader.read(params);
  return field && exact_real(field.ptr(), value) && store<float>(field.ptr(), stored);
}

}  // namespace

py::object stage_sampling_batch(py::handle params, bool with_seeds, int64_t top_k_all, int64_t default_seed,
                                py::handle stream, py::handle device) {
  PINSTAGE_ATTR_NAME(kTemperature, "temperature");
  PINSTAGE_ATTR_NAME(kTopP, "top_p");
  PINSTAGE_ATTR_NAME(kTopK, "top_k");
  PINSTAGE_ATTR_NAME(kMinP, "min_p");
  PINSTAGE_ATTR_NAME(kSeed, "sampling_seed");
  FieldReader temperature_field(kTemperature), top_p_field(kTopP), top_k_field(kTopK), min_p_field(kMinP),
      seed_field(kSeed);

  // First: it can run Python code (CUDA's lazy initialisation), and nothing is read yet.
  const Target target = resolve_target(stream.ptr(), device.ptr());
  Py_ssize_t bs = 0;
  if (!as_list_or_tuple(params.ptr(), &bs)) return py::none();  // items: read one by one, afresh (item_at)

  const size_t n = static_cast<size_t>(bs);
  std::vector<float> temperatures(n), top_ps(n), min_ps(n);
  std::vector<int32_t> top_ks(n);
  std::vector<int64_t> seeds(with_seeds ? n : 0);
  bool is_all_greedy = true, need_top_p = false, need_top_k = false, need_min_p = false;
  for (Py_ssize_t i = 0; i < bs; ++i) {
    // Held: a property getter below runs Python code, which could drop it from the caller's list.
    const Ref p_ref = item_at(params.ptr(), bs, i);
    if (!p_ref) return py::none();
    PyObject* p = p_ref.ptr();
    double temperature = 0, top_p = 0, min_p = 0;
    if (!real_field(p, temperature_field, &temperature, &temperatures[i]) || !(temperature >= 0)) return py::none();
    if (!real_field(p, top_p_field, &top_p, &top_ps[i]) || !(top_p > 0 && top_p <= 1)) return py::none();
    if (!real_field(p, min_p_field, &min_p, &min_ps[i]) || !(min_p >= 0 && min_p <= 1)) return py::none();
    const Ref top_k_obj = top_k_field.read(p);
    int64_t top_k = 0;
    if (!top_k_obj || !exact_int(top_k_obj.ptr(), &top_k) || top_k < 1) return py::none();
    if (!store<int32_t>(top_k_obj.ptr(), &top_ks[i])) return py::none();  // beyond int32: torch raises
    is_all_greedy = is_all_greedy && top_k <= 1;
    need_top_p = need_top_p || top_p < 1;
    need_top_k = need_top_k || top_k != top_k_all;
    need_min_p = need_min_p || min_p > 0;
    if (with_seeds) {
      const Ref seed = seed_field.read(p);
      if (!seed) return py::none();
      if (seed.is_none()) {
        seeds[i] = default_seed;
      } else if (!store<int64_t>(seed.ptr(), &seeds[i])) {
        return py::none();
      }
    }
  }

  std::vector<HostArray> arrays{
      {temperatures.data(), c10::kFloat, {bs, 1}},
      {top_ps.data(), c10::kFloat, {bs}},
      {top_ks.data(), c10::kInt, {bs}},
      {min_ps.data(), c10::kFloat, {bs}},
  };
  if (with_seeds) arrays.push_back({seeds.data(), c10::kLong, {bs}});
  py::list tensors = py::cast(stage_host_arrays(arrays, target, "pinstage::builders::sampling_batch"));
  return py::make_tuple(std::move(tensors), is_all_greedy, need_top_p, need_top_k, need_min_p);
}

}  // namespace pinstage::builders

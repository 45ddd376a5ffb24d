#include "convert/item_plan.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>

#include <cstring>

#include "convert/convert.h"
#include "convert/dtypes.h"
#include "convert/tensor_memory.h"
#include "python/py_objects.h"

namespace pinstage {
namespace {

// Never released: it must outlive every call, and decref'ing it during interpreter teardown
// (static destructors run after Python finalises) would crash.
PyObject* g_fallback = nullptr;

PyObject* dtype_object(c10::ScalarType t) { return reinterpret_cast<PyObject*>(torch::getTHPDtype(t)); }

at::Tensor call_fallback(PyObject* data, c10::ScalarType dtype) {
  TORCH_CHECK(g_fallback != nullptr,
              "pinstage: the fallback converter is not registered (import pinstage, not pinstage._C)");
  PyObject* result = checked(PyObject_CallFunctionObjArgs(g_fallback, data, dtype_object(dtype), nullptr));
  THPObjectPtr owned(result);
  TORCH_CHECK(is_tensor(result), "pinstage: the fallback converter returned a non-tensor");
  const at::Tensor& t = unpack_tensor(result);
  // torch.tensor dispatches, so under a dispatch mode (FakeTensorMode) or for a tensor subclass its
  // result can be a tensor without memory: refused, never read.
  TORCH_CHECK_TYPE(has_real_memory(t), "pinstage: torch.tensor converted the data of type ", Py_TYPE(data)->tp_name,
                   " to a ", Py_TYPE(result)->tp_name,
                   " without real memory (a tensor subclass or a dispatch mode such as FakeTensorMode is in "
                   "effect); pinstage stages only values held in memory");
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype,
              "pinstage: the fallback converter returned a tensor of the wrong device or dtype");
  NoPythonDispatch no_python;
  return t.contiguous();
}

// The data changed size between planning and writing: Python code run in between (an element's
// __index__, another item's conversion, another thread) resized it.
[[noreturn]] void data_changed(const ItemPlan& plan, c10::IntArrayRef now) {
  TORCH_CHECK(false, "pinstage: the data changed while it was being staged: its shape was ",
              c10::IntArrayRef(plan.shape), " when the call began and is ", now,
              " now (Python code run during the conversion modified it); nothing was staged");
}

// Converts by torch.tensor and copies the result: for whatever the fast paths decline.
void write_fallback(ItemPlan& plan, void* dst) {
  at::Tensor host = call_fallback(plan.data, plan.dtype);
  if (host.sizes() != c10::IntArrayRef(plan.shape)) data_changed(plan, host.sizes());
  plan.tensor = std::move(host);
  plan.source = ItemPlan::Source::kHeld;
  plan.via_fallback = true;
  if (plan.nbytes > 0) std::memcpy(dst, plan.tensor.data_ptr(), plan.nbytes);
}

// A bool tensor or buffer staged as bool is copied byte for byte, which keeps bytes other than 0
// and 1 (uint8 memory viewed as bool); torch's copy kernel reads any nonzero byte as true (1).
// Only bool items pay for the pass.
void normalize_bools(const ItemPlan& plan, void* dst) {
  if (plan.dtype != c10::ScalarType::Bool) return;
  auto* bytes = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < plan.nbytes; ++i) bytes[i] = bytes[i] != 0;
}

// torch.tensor(t, dtype=...) is t.detach().to(dtype, copy=True): torch's copy kernel, which also
// gathers a strided tensor and resolves the conj and neg bits. The tensor (storage included) is
// checked again first: Python code may have run since it was planned and resized or swapped it.
void write_tensor(const ItemPlan& plan, void* dst) {
  const at::Tensor& t = plan.tensor;
  if (!t.device().is_cpu() || t.sizes() != c10::IntArrayRef(plan.shape)) data_changed(plan, t.sizes());
  TORCH_CHECK(has_real_memory(t),
              "pinstage: the data tensor's storage changed while it was being staged (Python "
              "code run during the conversion resized or replaced it); nothing was staged");
  if (plan.nbytes == 0) return;
  if (t.scalar_type() == plan.dtype && t.is_contiguous() && !t.is_neg() && !t.is_conj()) {
    std::memcpy(dst, t.const_data_ptr(), plan.nbytes);
    normalize_bools(plan, dst);
    return;
  }
  NoPythonDispatch no_python;
  at::AutoDispatchBelowAutograd no_autograd;
  // copy_ from a negative view (tensor.conj().imag) negates its destination after copying, which
  // is wrong or missing for some dtypes (half, bool, unsigned): the source is negated first.
  at::from_blob(dst, plan.shape, at::TensorOptions().dtype(plan.dtype)).copy_(t.is_neg() ? t.resolve_neg() : t);
}

// torch.tensor reads a numpy scalar as the Python number it stands for: a scalar of the requested
// dtype keeps its bytes, except numpy's uint64, which torch refuses ("an integer is required").
bool numpy_scalar_copies_exactly(c10::ScalarType element_type, c10::ScalarType dtype) {
  return element_type == dtype && dtype != c10::ScalarType::UInt64;
}

// Refuses tensors whose storage bytes are not their values and that torch.tensor cannot convert
// either; true when the tensor's memory can be copied directly (else torch.tensor converts it).
bool tensor_is_copyable(const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.device().is_cpu(), "pinstage: data is a tensor on ", t.device().str(),
                   "; pinstage stages host data (for device tensors use tensor.to(device, non_blocking=True))");
  TORCH_CHECK_TYPE(t.layout() == c10::kStrided, "pinstage: data is a ", t.layout(),
                   " tensor; pinstage stages dense tensors (use tensor.to_dense())");
  TORCH_CHECK_TYPE(!t.is_nested(),
                   "pinstage: data is a nested tensor; pinstage stages dense tensors (stage "
                   "each component, or use tensor.to_padded_tensor())");
  TORCH_CHECK_TYPE(!t.is_quantized(), "pinstage: data is a quantized tensor (", dtype_name(t.scalar_type()),
                   "); its memory holds quantized integers, not values: stage tensor.dequantize()");
  return has_real_memory(t);
}

// A module already imported, or null: numpy's values cannot reach pinstage unless numpy was imported.
THPObjectPtr imported_module(const char* name) {
  THPObjectPtr text(PyUnicode_FromString(name));
  return THPObjectPtr(text ? PyImport_GetModule(text.get()) : nullptr);
}

// What a dtype argument that is not a torch.dtype is, for the error; a numpy dtype or scalar type
// (np.int64, np.dtype("int64")) is named with the torch dtype of the same name. Runs numpy's Python
// code, on this error path only.
std::string describe_non_dtype(PyObject* obj) {
  if (obj == nullptr) return "nothing";
  const bool is_type = PyType_Check(obj);
  const std::string text = is_type ? std::string("the type ") + reinterpret_cast<PyTypeObject*>(obj)->tp_name
                                   : std::string(Py_TYPE(obj)->tp_name);
  THPObjectPtr numpy = imported_module("numpy");
  THPObjectPtr generic(numpy ? PyObject_GetAttrString(numpy.get(), "generic") : nullptr);
  THPObjectPtr numpy_dtype(numpy ? PyObject_GetAttrString(numpy.get(), "dtype") : nullptr);
  const auto subtype = [](PyObject* cls, PyObject* base) {
    return cls != nullptr && base != nullptr && PyType_Check(cls) && PyType_Check(base) &&
           PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls), reinterpret_cast<PyTypeObject*>(base));
  };
  const bool numpy_type = is_type && subtype(obj, generic.get());
  const bool numpy_instance = subtype(reinterpret_cast<PyObject*>(Py_TYPE(obj)), numpy_dtype.get());
  THPObjectPtr as_dtype(numpy_type || numpy_instance ? PyObject_CallOneArg(numpy_dtype.get(), obj) : nullptr);
  THPObjectPtr name(as_dtype ? PyObject_GetAttrString(as_dtype.get(), "name") : nullptr);
  THPObjectPtr repr(numpy_instance ? PyObject_Repr(obj) : nullptr);
  const char* name_text = name && PyUnicode_Check(name.get()) ? PyUnicode_AsUTF8(name.get()) : nullptr;
  const char* repr_text = repr ? PyUnicode_AsUTF8(repr.get()) : nullptr;
  if (name_text == nullptr || (numpy_instance && repr_text == nullptr)) {
    PyErr_Clear();
    return text;
  }
  const std::string what = numpy_type ? std::string(reinterpret_cast<PyTypeObject*>(obj)->tp_name) + " (a numpy type)"
                                      : std::string("numpy.") + repr_text + " (a numpy dtype)";
  THPObjectPtr torch_module = imported_module("torch");
  THPObjectPtr counterpart(torch_module ? PyObject_GetAttrString(torch_module.get(), name_text) : nullptr);
  PyErr_Clear();
  if (counterpart && THPDtype_Check(counterpart.get())) return what + "; use torch." + name_text;
  return what + "; it has no torch dtype";
}

}  // namespace

size_t checked_nbytes(c10::IntArrayRef shape, c10::ScalarType dtype, int64_t* numel) {
  const size_t item = c10::elementSize(dtype);
  const size_t bytes = at::detail::computeStorageNbytesContiguous(shape, item);
  *numel = static_cast<int64_t>(bytes / item);  // exact; a product of the sizes could overflow before a 0
  return bytes;
}

c10::ScalarType parse_dtype(PyObject* dtype, const char* what) {
  TORCH_CHECK_TYPE(dtype != nullptr && THPDtype_Check(dtype), "pinstage: ", what, " must be a torch.dtype, got ",
                   describe_non_dtype(dtype));
  const c10::ScalarType t = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  TORCH_CHECK_TYPE(is_supported_dtype(t), "pinstage: unsupported dtype ", dtype_name(t),
                   "; supported: torch.bool, uint8, int8, int16, int32, int64, uint16, uint32, uint64, "
                   "float16, bfloat16, float32, float64");
  return t;
}

void set_fallback(PyObject* fn) {
  Py_XINCREF(fn);
  g_fallback = fn;  // a previous one is deliberately kept alive (see g_fallback)
}

ItemPlan plan_source(PyObject* data, c10::ScalarType dtype) {
  using Source = ItemPlan::Source;
  ItemPlan plan;
  plan.data = data;
  plan.dtype = dtype;
  // The fast shape test first: it is a few pointer compares.
  if (infer_fast_shape(data, &plan.shape)) {
    plan.source = Source::kPython;
  } else if (is_tensor(data) && tensor_is_copyable(unpack_tensor(data))) {
    plan.tensor = unpack_tensor(data);
    plan.source = Source::kTensor;
    plan.shape.assign(plan.tensor.sizes().begin(), plan.tensor.sizes().end());
  } else if (plan.buffer.open(data) && (plan.buffer.kind() != BufferSource::Kind::kNumpyScalar ||
                                        numpy_scalar_copies_exactly(plan.buffer.element_type(), dtype))) {
    plan.source = Source::kBuffer;
    plan.shape.assign(plan.buffer.shape().begin(), plan.buffer.shape().end());
  } else {
    plan.buffer = BufferSource();
    plan.source = Source::kFallback;
    return plan;
  }
  plan.nbytes = checked_nbytes(plan.shape, dtype, &plan.numel);
  return plan;
}

void convert_by_fallback(ItemPlan& plan) {
  if (plan.source != ItemPlan::Source::kFallback) return;
  plan.tensor = call_fallback(plan.data, plan.dtype);
  plan.source = ItemPlan::Source::kHeld;
  plan.via_fallback = true;
  plan.shape.assign(plan.tensor.sizes().begin(), plan.tensor.sizes().end());
  plan.nbytes = checked_nbytes(plan.shape, plan.dtype, &plan.numel);
}

ItemPlan plan_item(PyObject* data, c10::ScalarType dtype) {
  ItemPlan plan = plan_source(data, dtype);
  convert_by_fallback(plan);
  return plan;
}

void write_item(ItemPlan& plan, void* dst) {
  using Source = ItemPlan::Source;
  switch (plan.source) {
    case Source::kPython:
      if (write_fast(plan.data, plan.shape, plan.dtype, dst)) return;
      break;
    case Source::kBuffer:
      if (!plan.buffer.unchanged(plan.data)) data_changed(plan, plan.buffer.shape());
      if (plan.buffer.write(plan.dtype, dst)) return normalize_bools(plan, dst);
      break;
    case Source::kTensor:
      write_tensor(plan, dst);
      return;
    case Source::kHeld:
      if (plan.nbytes > 0) std::memcpy(dst, plan.tensor.data_ptr(), plan.nbytes);
      return;
    case Source::kFallback:
      TORCH_CHECK(false, "pinstage: internal error: an item was written before its fallback conversion");
  }
  write_fallback(plan, dst);
}

void write_fresh_item(ItemPlan& plan, void* dst) {
  if (plan.source != ItemPlan::Source::kBuffer) return write_item(plan, dst);
  if (!plan.buffer.write(plan.dtype, dst)) return write_fallback(plan, dst);
  normalize_bools(plan, dst);
}

at::Tensor cpu_values(ItemPlan& plan) {
  if (plan.source == ItemPlan::Source::kHeld) return plan.tensor;
  at::Tensor out;
  {
    NoPythonDispatch no_python;
    out = at::empty(plan.shape, at::TensorOptions().dtype(plan.dtype));
  }
  write_item(plan, out.data_ptr());
  return plan.source == ItemPlan::Source::kHeld ? plan.tensor : out;
}

void hold_values(ItemPlan& plan) {
  if (plan.source == ItemPlan::Source::kHeld) return;
  plan.tensor = cpu_values(plan);
  plan.source = ItemPlan::Source::kHeld;
  plan.buffer = BufferSource();
}

}  // namespace pinstage

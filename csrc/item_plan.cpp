#include "item_plan.h"

#include <torch/csrc/Dtype.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

#include "convert.h"
#include "dtypes.h"
#include "tensor_check.h"

namespace py = pybind11;

namespace pinstage {
namespace {

// Never released: it must outlive every call, and decref'ing it during interpreter teardown
// (static destructors run after Python finalises) would crash.
PyObject* g_fallback = nullptr;

PyObject* dtype_object(c10::ScalarType t) {
  return reinterpret_cast<PyObject*>(torch::getTHPDtype(t));
}

at::Tensor call_fallback(PyObject* data, c10::ScalarType dtype) {
  TORCH_CHECK(g_fallback != nullptr, "pinstage: the fallback converter is not registered (import pinstage, not pinstage._C)");
  py::object result = py::reinterpret_borrow<py::object>(g_fallback)(py::handle(data), py::handle(dtype_object(dtype)));
  TORCH_CHECK(is_tensor(result.ptr()), "pinstage: the fallback converter returned a non-tensor");
  at::Tensor t = THPVariable_Unpack(result.ptr());
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype,
              "pinstage: the fallback converter returned a tensor of the wrong device or dtype");
  return t.contiguous();
}

}  // namespace

size_t checked_nbytes(c10::IntArrayRef shape, c10::ScalarType dtype, int64_t* numel) {
  int64_t n = 1;
  int64_t bytes = 0;
  bool overflow = false;
  for (int64_t s : shape) overflow |= __builtin_mul_overflow(n, s, &n);
  overflow |= __builtin_mul_overflow(n, static_cast<int64_t>(c10::elementSize(dtype)), &bytes);
  TORCH_CHECK(!overflow, "pinstage: storage size calculation overflowed: shape ", shape, " of ",
              c10::toString(dtype), " is more than 2**63 - 1 bytes");
  *numel = n;
  return static_cast<size_t>(bytes);
}

c10::ScalarType parse_dtype(PyObject* dtype, const char* what) {
  TORCH_CHECK_TYPE(dtype != nullptr && THPDtype_Check(dtype), "pinstage: ", what, " must be a torch.dtype, got ",
                   dtype == nullptr ? "nothing" : Py_TYPE(dtype)->tp_name);
  const c10::ScalarType t = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  TORCH_CHECK_TYPE(is_supported_dtype(t), "pinstage: unsupported dtype ", py::str(dtype).cast<std::string>(),
                   "; supported: torch.bool, uint8, int8, int16, int32, int64, uint16, uint32, uint64, "
                   "float16, bfloat16, float32, float64");
  return t;
}

void set_fallback(PyObject* fn) {
  Py_XINCREF(fn);
  g_fallback = fn;  // a previous one is deliberately kept alive (see g_fallback)
}

ItemPlan plan_item(PyObject* data, c10::ScalarType dtype) {
  ItemPlan plan;
  plan.data = data;
  plan.dtype = dtype;
  // The fast shape test first: it is a few pointer compares, while THPVariable_Check of a list
  // goes through isinstance.
  if (infer_fast_shape(data, &plan.shape)) {
    plan.fast = true;
  } else if (is_tensor(data)) {
    const at::Tensor& t = THPVariable_Unpack(data);
    TORCH_CHECK_TYPE(t.device().is_cpu(), "pinstage: data is a tensor on ", t.device().str(),
                     "; pinstage stages host data (for device tensors use tensor.to(device, non_blocking=True))");
    // torch.tensor(t, dtype=...) copies and detaches; .to(copy=true) does the same, and
    // contiguous() gives the row-major bytes the copy needs.
    plan.host = t.detach().to(dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
  } else {
    plan.host = call_fallback(data, dtype);
    plan.via_fallback = true;
  }
  if (!plan.fast) plan.shape.assign(plan.host.sizes().begin(), plan.host.sizes().end());
  plan.nbytes = checked_nbytes(plan.shape, dtype, &plan.numel);
  return plan;
}

bool write_item(ItemPlan& plan, void* dst) {
  if (plan.fast) {
    if (write_fast(plan.data, plan.shape, plan.dtype, dst)) return false;
    plan.host = call_fallback(plan.data, plan.dtype);
    // Both shape inferences follow first elements from a Python scalar leaf, so they agree unless
    // Python code run since planning (an element's __index__, another thread) resized the data.
    TORCH_CHECK(plan.host.sizes() == c10::IntArrayRef(plan.shape), "pinstage: the data changed while it was being staged: ",
                "its shape was ", c10::IntArrayRef(plan.shape), " when the call began and is ", plan.host.sizes(),
                " now (Python code run during the conversion modified it); nothing was staged");
    plan.fast = false;
    plan.via_fallback = true;
    if (plan.nbytes > 0) std::memcpy(dst, plan.host.data_ptr(), plan.nbytes);
    return true;
  }
  if (plan.nbytes > 0) std::memcpy(dst, plan.host.data_ptr(), plan.nbytes);
  return false;
}

at::Tensor host_tensor(ItemPlan& plan) {
  if (!plan.fast) return plan.host;
  at::Tensor out = at::empty(plan.shape, at::TensorOptions().dtype(plan.dtype));
  write_item(plan, out.data_ptr());
  return plan.fast ? out : plan.host;
}

}  // namespace pinstage

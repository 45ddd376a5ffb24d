// Whether a tensor's bytes may be read or written by pinstage directly (memcpy or an async copy).
// Only a dense tensor whose storage is real host or device memory qualifies: a Python subclass
// (FakeTensor, a _make_wrapper_subclass tensor), a zero tensor, a nested or quantized tensor has a
// null data pointer or bytes that do not mean its values; those go to torch or are refused.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace pinstage {

// Held while pinstage allocates or copies its own tensors: a Python dispatch mode (FakeTensorMode,
// a TorchDispatchMode) must not see them, or it would hand back a tensor without real memory to
// write through.
struct NoPythonDispatch : c10::impl::ExcludeDispatchKeyGuard {
  NoPythonDispatch()
      : ExcludeDispatchKeyGuard(c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})) {}
};

// Dispatch keys whose kernels, not the storage, say what a tensor holds.
inline bool has_value_dispatch_key(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::PythonTLSSnapshot) ||
         keys.has(c10::DispatchKey::ZeroTensor) || keys.has(c10::DispatchKey::Functionalize);
}

// The bytes its sizes, strides and offset reach lie inside its storage right now. Checked right
// before each direct copy: Python code run since the tensor was first looked at may have resized
// or swapped its storage.
inline bool storage_covers(const at::Tensor& t) {
  if (!t.has_storage()) return false;
  const size_t needed =
      at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(), static_cast<size_t>(t.storage_offset()));
  if (needed == 0) return true;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  return storage->data_ptr().get() != nullptr && storage->nbytes() >= needed;
}

// Dense, strided, not quantized, no dispatch key that stands in for storage, and the storage
// covers it: its bytes are its values.
inline bool has_real_memory(const at::Tensor& t) {
  return t.defined() && t.layout() == c10::kStrided && !t.is_nested() && !t.is_quantized() &&
         !has_value_dispatch_key(t) && storage_covers(t);
}

}  // namespace pinstage

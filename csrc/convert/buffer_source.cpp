#include "convert/buffer_source.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "convert/dtypes.h"
#include "convert/scalar_store.h"
#include "convert/tensor_memory.h"

namespace pinstage {
namespace {

// Borrowed for the life of the process (the modules are never unloaded while torch is loaded).
PyTypeObject* g_numpy_ndarray = nullptr;
PyTypeObject* g_numpy_generic = nullptr;
PyTypeObject* g_array_array = nullptr;

PyTypeObject* as_type(PyObject* o) {
  if (o == nullptr || o == Py_None) return nullptr;
  if (!PyType_Check(o)) return nullptr;
  Py_INCREF(o);  // kept for good: see above
  return reinterpret_cast<PyTypeObject*>(o);
}

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr char kNativeOrder = '<';
#else
constexpr char kNativeOrder = '>';
#endif

// The torch dtype of a struct-module format code, by its kind and the exporter's item size (native
// 'l' is 8 bytes where standard '<l' is 4); Undefined for anything else (complex, structured,
// object, the other byte order). A sequence (memoryview, array.array) is read by torch through
// memoryview item access, which knows only native formats ('q' or '@q'): ctypes' '<q' makes
// torch.tensor raise ValueError, so it is declined and torch raises it.
c10::ScalarType element_type_of(const char* format, Py_ssize_t itemsize, bool sequence) {
  using c10::ScalarType;
  if (format == nullptr) return itemsize == 1 ? ScalarType::Byte : ScalarType::Undefined;  // "B" by the PEP
  if (*format == '@' || (!sequence && (*format == '=' || *format == kNativeOrder))) ++format;
  if (format[0] == '\0' || format[1] != '\0') return ScalarType::Undefined;
  const auto by_size = [itemsize](ScalarType s1, ScalarType s2, ScalarType s4, ScalarType s8) {
    switch (itemsize) {
      case 1:
        return s1;
      case 2:
        return s2;
      case 4:
        return s4;
      case 8:
        return s8;
      default:
        return ScalarType::Undefined;
    }
  };
  switch (format[0]) {
    case '?':
      return itemsize == 1 ? ScalarType::Bool : ScalarType::Undefined;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      return by_size(ScalarType::Char, ScalarType::Short, ScalarType::Int, ScalarType::Long);
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
      return by_size(ScalarType::Byte, ScalarType::UInt16, ScalarType::UInt32, ScalarType::UInt64);
    case 'e':
      return itemsize == 2 ? ScalarType::Half : ScalarType::Undefined;
    case 'f':
      return itemsize == 4 ? ScalarType::Float : ScalarType::Undefined;
    case 'd':
      return itemsize == 8 ? ScalarType::Double : ScalarType::Undefined;
    default:
      return ScalarType::Undefined;
  }
}

// One element of a sequence, converted as torch.tensor converts the Python number it reads as.
template <class T, class S>
bool store_element(const S& v, T* out) {
  if constexpr (std::is_floating_point_v<S>) {
    return store_double<T>(static_cast<double>(v), out);
  } else if constexpr (std::is_signed_v<S>) {
    return store_int<T>(static_cast<long long>(v), out);
  } else if constexpr (std::is_integral_v<S>) {
    if (static_cast<unsigned long long>(v) > static_cast<unsigned long long>(INT64_MAX)) return false;
    return store_int<T>(static_cast<long long>(v), out);
  } else {
    return false;  // half elements: not read as sequences (see open())
  }
}

// `count` elements of N bytes, `stride` bytes apart, packed into dst.
template <size_t N>
void copy_elements(uint8_t* dst, const uint8_t* src, int64_t count, int64_t stride) {
  for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * static_cast<int64_t>(N), src + i * stride, N);
}

// The elements of a strided array in row-major order, packed into dst, as torch's copy kernel
// gathers them for a copy of the same dtype, without its setup (which costs more than the gather
// for the short columns engines stage: a [n, 3] column's slice, say). Strides are non-negative.
void gather_strided(uint8_t* dst, const uint8_t* src, c10::IntArrayRef shape, c10::IntArrayRef element_strides,
                    size_t itemsize) {
  const size_t inner = shape.size() - 1;
  const int64_t row = shape[inner];
  const int64_t step = element_strides[inner] * static_cast<int64_t>(itemsize);
  const size_t row_bytes = static_cast<size_t>(row) * itemsize;
  c10::DimVector index(inner, 0);
  for (;;) {
    int64_t offset = 0;
    for (size_t d = 0; d < inner; ++d) offset += index[d] * element_strides[d];
    const uint8_t* from = src + offset * static_cast<int64_t>(itemsize);
    if (step == static_cast<int64_t>(itemsize)) {
      std::memcpy(dst, from, row_bytes);
    } else {
      switch (itemsize) {
        case 1:
          copy_elements<1>(dst, from, row, step);
          break;
        case 2:
          copy_elements<2>(dst, from, row, step);
          break;
        case 4:
          copy_elements<4>(dst, from, row, step);
          break;
        default:
          copy_elements<8>(dst, from, row, step);
          break;
      }
    }
    dst += row_bytes;
    size_t d = inner;
    while (d > 0 && ++index[d - 1] == shape[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

void register_buffer_types(PyObject* numpy_ndarray, PyObject* numpy_generic, PyObject* array_array) {
  g_numpy_ndarray = as_type(numpy_ndarray);
  g_numpy_generic = as_type(numpy_generic);
  g_array_array = as_type(array_array);
}

BufferSource& BufferSource::operator=(BufferSource&& other) noexcept {
  if (this != &other) {
    release();
    view_ = std::move(other.view_);
    kind_ = other.kind_;
    element_type_ = other.element_type_;
    shape_ = std::move(other.shape_);
    element_strides_ = std::move(other.element_strides_);
    data_ = other.data_;
    itemsize_ = other.itemsize_;
  }
  return *this;
}

BufferSource::~BufferSource() { release(); }

void BufferSource::release() {
  if (view_ != nullptr) PyBuffer_Release(view_.get());
  view_.reset();
}

bool BufferSource::open(PyObject* obj) {
  release();
  if (g_numpy_ndarray != nullptr && PyObject_TypeCheck(obj, g_numpy_ndarray)) {
    kind_ = Kind::kNumpyArray;
  } else if (g_numpy_generic != nullptr && PyObject_TypeCheck(obj, g_numpy_generic)) {
    kind_ = Kind::kNumpyScalar;
  } else if ((g_array_array != nullptr && Py_TYPE(obj) == g_array_array) || PyMemoryView_Check(obj) ||
             PyByteArray_CheckExact(obj)) {
    kind_ = Kind::kSequence;
  } else {
    return false;
  }
  // A numpy array's export is read here and released at once (see buffer_source.h): a Py_buffer on
  // the stack, no allocation. The others are held, on the heap.
  Py_buffer local;
  std::unique_ptr<Py_buffer> held;
  Py_buffer* view = &local;
  if (kind_ != Kind::kNumpyArray) {
    held = std::make_unique<Py_buffer>();
    view = held.get();
  }
  if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();  // e.g. numpy object arrays: torch.tensor says what is wrong with them
    return false;
  }
  const bool ok = read_view(*view);
  if (ok && held != nullptr) {
    view_ = std::move(held);
  } else {
    PyBuffer_Release(view);
  }
  return ok;
}

bool BufferSource::read_view(const Py_buffer& v) {
  element_type_ = element_type_of(v.format, v.itemsize, kind_ == Kind::kSequence);
  // torch.tensor reads a memoryview of halves as a sequence it cannot size, and a sequence of more
  // than one dimension not at all: let it raise its own errors. A numpy scalar that exports more
  // than one element (bytes_, datetime64 and timedelta64 show their bytes) is no number of that
  // element type: torch.tensor decides.
  bool readable = element_type_ != c10::ScalarType::Undefined;
  switch (kind_) {
    case Kind::kSequence:
      readable = readable && v.ndim == 1 && element_type_ != c10::ScalarType::Half;
      break;
    case Kind::kNumpyScalar:
      readable = readable && v.ndim == 0;
      break;
    case Kind::kNumpyArray:
      // torch maps an array's element type by numpy's type number, not its size: where C long is
      // 64 bits, uint64 is 'L' and an array of ulonglong ('Q', the same bytes) is refused.
      readable = readable && !(sizeof(long) == 8 && element_type_ == c10::ScalarType::UInt64 &&
                               std::strchr(v.format, 'Q') != nullptr);
      break;
  }
  // PyBUF_RECORDS_RO asks for strides, but an exporter may leave them out (numpy's datetime64
  // scalars do): read only what was given.
  if (!readable || (v.ndim > 0 && (v.shape == nullptr || v.strides == nullptr))) return false;
  shape_.assign(v.shape, v.shape + v.ndim);
  element_strides_.resize(static_cast<size_t>(v.ndim));
  for (int d = 0; d < v.ndim; ++d) {
    // Negative or fractional strides: torch.from_numpy refuses them (ValueError), so torch decides.
    if (v.strides[d] < 0 || v.strides[d] % v.itemsize != 0) return false;
    element_strides_[static_cast<size_t>(d)] = v.strides[d] / v.itemsize;
  }
  data_ = v.buf;
  itemsize_ = v.itemsize;
  return true;
}

bool BufferSource::unchanged(PyObject* obj) const {
  if (kind_ != Kind::kNumpyArray) return true;  // the held export keeps the memory where it was
  Py_buffer now;
  if (PyObject_GetBuffer(obj, &now, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  bool same = now.buf == data_ && now.itemsize == itemsize_ && now.ndim == static_cast<int>(shape_.size());
  for (int d = 0; same && d < now.ndim; ++d) {
    same = now.shape[d] == shape_[static_cast<size_t>(d)] &&
           now.strides[d] == element_strides_[static_cast<size_t>(d)] * itemsize_;
  }
  PyBuffer_Release(&now);
  return same;
}

bool BufferSource::contiguous() const {
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(shape_.size()) - 1; d >= 0; --d) {
    if (shape_[d] != 1 && element_strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

bool BufferSource::write(c10::ScalarType dtype, void* dst) const {
  const size_t itemsize = c10::elementSize(element_type_);
  int64_t numel = 1;
  for (int64_t s : shape_) numel *= s;  // checked by the caller's plan (checked_nbytes)
  if (numel == 0) return true;
  // A sequence's '?' bytes are read as Python bools (any nonzero byte is True), never copied: a
  // byte of 2 or 255 is not a valid bool.
  const bool sequence_of_bools = kind_ == Kind::kSequence && element_type_ == c10::ScalarType::Bool;
  if (dtype == element_type_ && !sequence_of_bools) {
    if (contiguous()) {
      std::memcpy(dst, data_, static_cast<size_t>(numel) * itemsize);
    } else {
      gather_strided(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(data_), shape_, element_strides_,
                     itemsize);
    }
    return true;
  }
  if (kind_ == Kind::kNumpyArray) {
    // torch.tensor(array, dtype=...) is torch.from_numpy(array).to(dtype): torch's own copy kernel
    // for the cast (and the gather of a strided array). Python dispatch modes are kept out of it.
    const NoPythonDispatch no_python;
    const at::Tensor src =
        at::from_blob(const_cast<void*>(data_), shape_, element_strides_, at::TensorOptions().dtype(element_type_));
    at::from_blob(dst, shape_, at::TensorOptions().dtype(dtype)).copy_(src);
    return true;
  }
  if (kind_ == Kind::kNumpyScalar) return false;  // torch.tensor decides every cast of a numpy scalar
  // A 1-D sequence of Python numbers: each element as torch.tensor converts that number.
  const auto* base = static_cast<const uint8_t*>(data_);
  const int64_t stride = element_strides_[0] * itemsize_;
  return dispatch_dtype(dtype, [&](auto out_tag) {
    using T = decltype(out_tag);
    T* out = static_cast<T*>(dst);
    return dispatch_dtype(element_type_, [&](auto in_tag) {
      using S = decltype(in_tag);
      for (int64_t i = 0; i < numel; ++i) {
        if constexpr (std::is_same_v<S, bool>) {
          uint8_t byte;
          std::memcpy(&byte, base + i * stride, 1);
          if (!store_bool<T>(byte != 0, out + i)) return false;
        } else {
          S v;
          std::memcpy(&v, base + i * stride, sizeof(S));
          if (!store_element<T, S>(v, out + i)) return false;
        }
      }
      return true;
    });
  });
}

}  // namespace pinstage

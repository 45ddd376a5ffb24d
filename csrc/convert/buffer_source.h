// Data that exposes its memory through the buffer protocol (PEP 3118): numpy arrays and scalars,
// array.array, memoryview and bytearray. Their bytes are copied as they are when the element type
// is the requested one; otherwise they are cast by torch's own rules for that kind of data.
#pragma once

#include <Python.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace pinstage {

// Tells pinstage which Python types are numpy's and array's (pinstage/__init__.py passes them;
// None where a module is not installed). Without it only memoryview and bytearray are read here.
void register_buffer_types(PyObject* numpy_ndarray, PyObject* numpy_generic, PyObject* array_array);

// A held buffer export. Holding it keeps array.array and bytearray from resizing or freeing the
// memory until the bytes have been written; numpy does not refuse, hence unchanged().
class BufferSource {
 public:
  // How torch.tensor treats the data, which decides how a cast is done.
  enum class Kind : uint8_t {
    kNumpyArray,   // torch.from_numpy(x).to(dtype): torch's tensor cast
    kNumpyScalar,  // a numpy scalar: exact copies only, torch.tensor decides the rest
    kSequence,     // a 1-D sequence of Python numbers (array.array, memoryview, bytearray)
  };

  BufferSource() = default;
  BufferSource(const BufferSource&) = delete;
  BufferSource& operator=(const BufferSource&) = delete;
  BufferSource(BufferSource&& other) noexcept = default;
  BufferSource& operator=(BufferSource&& other) noexcept;
  ~BufferSource();  // releases the export; the GIL is held

  // Exports obj's buffer when obj is data of one of the kinds above whose layout pinstage reads
  // exactly as torch.tensor would; false (no Python error set) for anything else.
  bool open(PyObject* obj);

  Kind kind() const { return kind_; }
  c10::ScalarType element_type() const { return element_type_; }
  const std::vector<int64_t>& shape() const { return shape_; }

  // Whether obj still exports the memory, shape and strides that open() read. numpy lets Python
  // code resize or replace an array's memory while an export is held (a.resize(n, refcheck=False)),
  // so the memory is checked again right before it is read.
  bool unchanged(PyObject* obj) const;

  // Writes every element as `dtype` into dst (room for numel(shape) of them). Returns false, maybe
  // after writing part of dst, when a value is one that torch.tensor must convert itself.
  bool write(c10::ScalarType dtype, void* dst) const;

 private:
  void release();
  bool contiguous() const;

  // On the heap: an exporter may point the view's fields into the struct itself (array.array's
  // strides do), so it must not move; only the copies below are read after open().
  std::unique_ptr<Py_buffer> view_;
  Kind kind_ = Kind::kSequence;
  c10::ScalarType element_type_ = c10::ScalarType::Undefined;
  std::vector<int64_t> shape_;
  std::vector<int64_t> element_strides_;
  const void* data_ = nullptr;
  int64_t itemsize_ = 0;
};

}  // namespace pinstage

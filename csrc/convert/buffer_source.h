// Data that exposes its memory through the buffer protocol (PEP 3118): numpy arrays and scalars,
// array.array, memoryview and bytearray. Their bytes are copied as they are when the element type
// is the requested one; otherwise they are cast by torch's own rules for that kind of data.
#pragma once

#include <Python.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/DimVector.h>

#include <cstdint>
#include <memory>

namespace pinstage {

// Tells pinstage which Python types are numpy's and array's (pinstage/__init__.py passes them;
// None where a module is not installed). Without it only memoryview and bytearray are read here.
void register_buffer_types(PyObject* numpy_ndarray, PyObject* numpy_generic, PyObject* array_array);

// What a buffer export showed: its memory, element type, shape and strides. array.array, bytearray,
// memoryview and numpy scalars keep the export held until the source is released (it keeps the
// first two from resizing, and a numpy scalar's export owns the memory it shows); a numpy array's
// export is released at once, as holding it would not stop numpy from moving the memory
// (a.resize(n, refcheck=False)): unchanged() checks the array again right before it is read.
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
  c10::IntArrayRef shape() const { return shape_; }

  // Whether obj still shows the memory, shape and strides that open() read: re-exported for a numpy
  // array (Python code may have moved its memory since), true for the kinds whose export is held.
  bool unchanged(PyObject* obj) const;

  // Writes every element as `dtype` into dst (room for numel(shape) of them). Returns false, maybe
  // after writing part of dst, when a value is one that torch.tensor must convert itself.
  bool write(c10::ScalarType dtype, void* dst) const;

 private:
  void release();
  // Reads the export's fields into the members; false where torch.tensor must convert the data.
  bool read_view(const Py_buffer& view);
  bool contiguous() const;

  // The held export, where one is held. On the heap: an exporter may point the view's fields into
  // the struct itself (array.array's strides do), so it must not move; only the copies below are
  // read after open().
  std::unique_ptr<Py_buffer> view_;
  Kind kind_ = Kind::kSequence;
  c10::ScalarType element_type_ = c10::ScalarType::Undefined;
  c10::DimVector shape_;  // inline up to 5 dimensions, as the plans' shapes: no allocation per item
  c10::DimVector element_strides_;
  const void* data_ = nullptr;
  int64_t itemsize_ = 0;
};

}  // namespace pinstage

// Python values -> typed bytes, written straight into a destination buffer.
//
// The fast path covers what engines hand over every step: Python ints, floats and bools, flat or
// nested (rectangular) lists and tuples of them, and range. It converts each element exactly as
// torch.tensor(data, dtype=dtype) does, and where it cannot be sure of that (an element of another
// type, a value torch would reject, wrap or round differently, a ragged list) it declines, so the
// caller can fall back to torch.tensor itself. It raises only where torch.tensor raises for the
// structure itself (more than kMaxDims levels of nesting).
#pragma once

#include <Python.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/DimVector.h>

#include <cstdint>

namespace pinstage {

// torch.tensor refuses data nested deeper than this (ValueError: too many dimensions).
constexpr size_t kMaxDims = 128;

// Fills `shape` the way torch.tensor infers it (length of each level, following first elements)
// and returns true when `obj` is a structure the fast path can write: a Python scalar, a range, or
// nested lists/tuples whose first leaf is a Python scalar. Returns false otherwise.
bool infer_fast_shape(PyObject* obj, c10::DimVector* shape);

// Writes the numel(shape) elements of `obj` (accepted by infer_fast_shape with that shape) as
// `dtype` into `dst`. Returns false, possibly after writing part of dst, when an element is not
// one the fast path converts exactly; the caller must then use torch.tensor's own conversion.
bool write_fast(PyObject* obj, c10::IntArrayRef shape, c10::ScalarType dtype, void* dst);

}  // namespace pinstage

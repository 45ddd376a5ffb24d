// stage_to_device as a plain METH_FASTCALL function: it is the call engines make most, many times
// per step, and the generic pybind11 dispatcher (keyword handling, overload resolution) costs a
// noticeable share of a few-microsecond call.
#pragma once

#include <Python.h>

#include <exception>

namespace pinstage {

// Sets the Python error for a C++ exception the way the bindings do: c10::TypeError -> TypeError,
// c10::ValueError -> ValueError, c10::IndexError -> IndexError, other c10::Error -> RuntimeError
// (without the C++ backtrace), pybind11::error_already_set -> the Python error it holds,
// std::bad_alloc -> MemoryError, anything else -> RuntimeError.
void set_python_error(std::exception_ptr p);

extern PyMethodDef kStageToDeviceDef;

}  // namespace pinstage

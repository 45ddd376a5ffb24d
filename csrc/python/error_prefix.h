// Naming the part of a call that failed ("item 3", "field 'top_ks'") in the error it raised,
// whatever raised it (a Python error from the fallback, a TypeError or ValueError from the core).
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <typeinfo>

#include "python/py_objects.h"

namespace pinstage {

// Runs fn(); an error it raises keeps its exception type, its message prefixed with prefix() + ": ".
// prefix is called only when there is an error.
template <class Prefix, class Fn>
auto with_error_prefix(Prefix&& prefix, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const PythonError&) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (type == nullptr) throw;
    PyErr_NormalizeException(&type, &value, &traceback);
    THPObjectPtr text(value != nullptr ? PyObject_Str(value) : nullptr);
    const char* message = text.get() != nullptr ? PyUnicode_AsUTF8(text.get()) : nullptr;
    if (message == nullptr) PyErr_Clear();
    const std::string where = prefix();
    PyErr_Format(type, "%s: %s", where.c_str(), message != nullptr ? message : "(no message)");
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    throw PythonError();
  } catch (const c10::TypeError& e) {
    TORCH_CHECK_TYPE(false, prefix(), ": ", e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, prefix(), ": ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    if (typeid(e) != typeid(c10::Error)) throw;  // OutOfMemoryError and the like keep their type
    TORCH_CHECK(false, prefix(), ": ", e.what_without_backtrace());
  }
}

}  // namespace pinstage

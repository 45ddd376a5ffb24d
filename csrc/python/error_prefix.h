// Naming the part of a call that failed ("item 3", "field 'top_ks'") in the error it raised,
// whatever raised it (a Python error from the fallback, a TypeError or ValueError from the core).
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <typeinfo>

#include "python/py_objects.h"

namespace pinstage {

// pinstage._fallback.remade, registered at import: the one rule for re-making an error with its
// location in front of its message (its cause, context, notes and traceback kept; where its class
// cannot be made from one message, the original with the location as a note). Never released, as
// the fallback converter is not.
inline PyObject* g_remade = nullptr;

inline void set_remade(PyObject* fn) {
  Py_XINCREF(fn);
  g_remade = fn;
}

// remade(value, where) as a new reference, or null: not registered, or it raised. An error it
// raised that is an Exception is cleared; any other (a KeyboardInterrupt from a signal handler that
// ran meanwhile) stays set, to be raised instead.
inline PyObject* remade(PyObject* value, const std::string& where) {
  if (g_remade == nullptr) return nullptr;
  THPObjectPtr text(PyUnicode_FromStringAndSize(where.data(), static_cast<Py_ssize_t>(where.size())));
  PyObject* made = text.get() != nullptr ? PyObject_CallFunctionObjArgs(g_remade, value, text.get(), nullptr) : nullptr;
  if (made == nullptr && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
  if (made != nullptr && !PyExceptionInstance_Check(made)) Py_CLEAR(made);  // only an exception can be raised
  return made;
}

// Runs fn(); an error it raises (an Exception) is re-made by remade with prefix() as its location,
// keeping its type; any other exception goes on as raised. prefix is called only when there is one.
template <class Prefix, class Fn>
auto with_error_prefix(Prefix&& prefix, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const PythonError&) {
    const std::string where = prefix();  // before the fetch: nothing to leak if it throws
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (type == nullptr) throw;
    PyErr_NormalizeException(&type, &value, &traceback);
    // Errors only: a KeyboardInterrupt or SystemExit goes on as it was raised.
    const bool is_error = value != nullptr && PyErr_GivenExceptionMatches(type, PyExc_Exception);
    if (PyObject* made = is_error ? remade(value, where) : nullptr) {
      // Restored with its own type: a __new__ may return an instance of another class.
      Py_INCREF(Py_TYPE(made));
      Py_DECREF(type);
      type = reinterpret_cast<PyObject*>(Py_TYPE(made));
      Py_DECREF(value);
      value = made;
    } else if (PyErr_Occurred() != nullptr) {
      // An interrupt raised while it was re-made: raised instead, the original its context.
      PyObject *raised_type, *raised, *raised_traceback;
      PyErr_Fetch(&raised_type, &raised, &raised_traceback);
      PyErr_NormalizeException(&raised_type, &raised, &raised_traceback);
      if (traceback != nullptr) PyException_SetTraceback(value, traceback);
      if (raised != nullptr) {
        PyException_SetContext(raised, value);  // steals value
      } else {
        Py_DECREF(value);
      }
      Py_DECREF(type);
      Py_XDECREF(traceback);
      PyErr_Restore(raised_type, raised, raised_traceback);
      throw PythonError();
    }
    PyErr_Restore(type, value, traceback);
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

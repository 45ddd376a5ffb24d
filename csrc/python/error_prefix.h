// Naming the part of a call that failed ("item 3", "field 'top_ks'") in the error it raised,
// whatever raised it (a Python error from the fallback, a TypeError or ValueError from the core).
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <typeinfo>

#include "python/py_objects.h"

namespace pinstage {

// pinstage._fallback.remade, registered at import: the one rule for re-making an error with a
// longer message (its cause, context, notes and traceback kept), shared with the Python builders.
// Never released, as the fallback converter is not.
inline PyObject* g_remade = nullptr;

inline void set_remade(PyObject* fn) {
  Py_XINCREF(fn);
  g_remade = fn;
}

// Clears an error that Python code run here raised, unless it is no Exception (a KeyboardInterrupt
// from a signal handler, a SystemExit): that one stays set, to be raised instead. True if it stays.
inline bool clear_unless_interrupt() {
  if (PyErr_Occurred() == nullptr) return false;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return true;
  PyErr_Clear();
  return false;
}

// The error `value` again (its type, or what the type's __new__ returns), its message prefixed with
// where + ": ", as a new reference. Null with no error set where the type cannot be made from one
// message (an __init__ that takes other arguments): then the original is raised, the prefix added
// as a note (PEP 678) that its traceback shows. Null with an error set: see clear_unless_interrupt.
inline PyObject* prefixed_error(PyObject* value, const std::string& where) {
  THPObjectPtr text(PyObject_Str(value));
  const char* message = text.get() != nullptr ? PyUnicode_AsUTF8(text.get()) : nullptr;
  if (message == nullptr && clear_unless_interrupt()) return nullptr;
  const std::string prefixed = where + ": " + (message != nullptr ? message : "(no message)");
  THPObjectPtr arg(PyUnicode_FromStringAndSize(prefixed.data(), static_cast<Py_ssize_t>(prefixed.size())));
  PyObject* made = arg.get() != nullptr && g_remade != nullptr
                       ? PyObject_CallFunctionObjArgs(g_remade, value, arg.get(), nullptr)
                       : nullptr;
  if (made != nullptr && made != value && PyExceptionInstance_Check(made)) return made;
  Py_XDECREF(made);
  if (clear_unless_interrupt()) return nullptr;
  THPObjectPtr noted(PyObject_CallMethod(value, "add_note", "s", where.c_str()));
  if (noted.get() == nullptr) clear_unless_interrupt();
  return nullptr;
}

// Runs fn(); an error it raises keeps its exception type, its message prefixed with prefix() + ": ".
// prefix is called only when there is an error.
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
    PyObject* prefixed = value != nullptr ? prefixed_error(value, where) : nullptr;
    if (PyErr_Occurred() != nullptr) {
      // An interrupt raised while it was re-made: raised instead, the original its context.
      PyObject *raised_type, *raised, *raised_traceback;
      PyErr_Fetch(&raised_type, &raised, &raised_traceback);
      PyErr_NormalizeException(&raised_type, &raised, &raised_traceback);
      if (raised != nullptr) {
        PyException_SetContext(raised, value);  // steals value
      } else {
        Py_XDECREF(value);
      }
      Py_DECREF(type);
      Py_XDECREF(traceback);
      PyErr_Restore(raised_type, raised, raised_traceback);
      throw PythonError();
    }
    if (prefixed != nullptr) {
      // Restored with its own type: a __new__ may return an instance of another class.
      Py_INCREF(Py_TYPE(prefixed));
      Py_DECREF(type);
      type = reinterpret_cast<PyObject*>(Py_TYPE(prefixed));
      Py_XDECREF(value);
      value = prefixed;
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

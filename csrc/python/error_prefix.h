// Naming the part of a call that failed ("item 3", "field 'top_ks'") in the error it raised,
// whatever raised it (a Python error from the fallback, a TypeError or ValueError from the core).
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <typeinfo>

#include "python/py_objects.h"

namespace pinstage {

// What `made` takes over from the error it stands for: its cause, context and notes, so that a
// traceback shows the same chain (`raise ... from ...` inside a conversion included).
inline void keep_chain(PyObject* original, PyObject* made) {
  PyException_SetCause(made, PyException_GetCause(original));  // steals the new reference; may be null
  reinterpret_cast<PyBaseExceptionObject*>(made)->suppress_context =
      reinterpret_cast<PyBaseExceptionObject*>(original)->suppress_context;  // SetCause set it
  PyException_SetContext(made, PyException_GetContext(original));
  THPObjectPtr notes(PyObject_GetAttrString(original, "__notes__"));
  // A copy of PEP 678's list, not shared; anything else is left behind (as the fallback does).
  THPObjectPtr copied(notes.get() != nullptr && PyList_Check(notes.get()) ? PySequence_List(notes.get()) : nullptr);
  if (copied.get() == nullptr || PyObject_SetAttrString(made, "__notes__", copied.get()) != 0) PyErr_Clear();
}

// The error `value` of `type` again, its message prefixed with where + ": " (a new reference), or
// null where the type cannot be made from one message (an __init__ that takes other arguments):
// then the original is raised, the prefix added as a note (PEP 678) that its traceback shows.
inline PyObject* prefixed_error(PyObject* type, PyObject* value, const std::string& where) {
  THPObjectPtr text(value != nullptr ? PyObject_Str(value) : nullptr);
  const char* message = text.get() != nullptr ? PyUnicode_AsUTF8(text.get()) : nullptr;
  if (message == nullptr) PyErr_Clear();
  const std::string prefixed = where + ": " + (message != nullptr ? message : "(no message)");
  THPObjectPtr arg(PyUnicode_FromStringAndSize(prefixed.data(), static_cast<Py_ssize_t>(prefixed.size())));
  PyObject* made = arg.get() != nullptr ? PyObject_CallOneArg(type, arg.get()) : nullptr;
  if (made != nullptr && PyExceptionInstance_Check(made)) {
    if (value != nullptr) keep_chain(value, made);
    return made;
  }
  Py_XDECREF(made);
  PyErr_Clear();
  if (value != nullptr) {
    THPObjectPtr noted(PyObject_CallMethod(value, "add_note", "s", where.c_str()));
    if (noted.get() == nullptr) PyErr_Clear();
  }
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
    if (PyObject* prefixed = prefixed_error(type, value, where)) {
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

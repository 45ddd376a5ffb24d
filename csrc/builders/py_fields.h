// Reading request fields from Python objects for the builders' native gathers.
//
// A native gather never raises for the caller's data: anything it is not certain to convert as the
// Python builder would (a missing attribute, a value of another type, a value the builder rejects)
// makes it decline, and the Python builder then runs and stages or raises with its own message.
#pragma once

#include <Python.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <utility>

#include "../scalar_store.h"

namespace pinstage::builders {

// An interned attribute name, made once per process (the GIL is held by every caller).
#define PINSTAGE_ATTR_NAME(var, literal)                                   \
  static PyObject* const var = PyUnicode_InternFromString(literal);       \
  if (var == nullptr) throw pybind11::error_already_set()

// An owned reference for the gather loops, with Python's own inline reference counting
// (pybind11::object's is an out-of-line call, which a loop of several reads per request notices).
class Ref {
 public:
  Ref() = default;
  static Ref steal(PyObject* p) {
    Ref r;
    r.p_ = p;
    return r;
  }
  static Ref borrow(PyObject* p) {
    Py_XINCREF(p);
    return steal(p);
  }
  Ref(Ref&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Ref& operator=(Ref&& other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  C10_ALWAYS_INLINE ~Ref() { Py_XDECREF(p_); }

  PyObject* ptr() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool is_none() const { return p_ == Py_None; }

 private:
  PyObject* p_ = nullptr;
};

// Reads one attribute, by name, from each object of a batch.
//
// PyObject_GetAttr looks the name up on the object's type before its instance dict, for every
// object; for a batch of one class that repeated type lookup costs as much as the rest of the
// gather. Where Python would read the instance dict first (the class keeps the default
// __getattribute__ and has no data descriptor, such as a property, of that name), the reader looks
// up the class once per batch and then reads each object's dict; a name missing from the dict, and
// every other class, goes through PyObject_GetAttr, so class defaults, properties and __getattr__
// behave as in Python. (Reading __dict__ makes CPython build the dict of an object that kept its
// attributes inline; that happens once per object, as `vars(obj)` does it.) peek() is the dict read
// alone, for gathers that must know no getter ran. Fields are read request by request, where the
// Python builders read one field across the batch: only getters with side effects on other
// requests could tell the difference.
class FieldReader {
 public:
  explicit FieldReader(PyObject* name) : name_(name) {}
  ~FieldReader() { Py_XDECREF(type_); }
  FieldReader(const FieldReader&) = delete;
  FieldReader& operator=(const FieldReader&) = delete;

  // obj.<name> from the object's instance dict, borrowed, or null (no error set) when the generic
  // lookup must decide: a property or other data descriptor, __getattr__, a class default, no
  // __dict__. Runs no getter (nor a non-str dict key's __eq__, which no attribute assignment makes).
  // Building the dict of an object that kept its attributes inline allocates, and an allocation may
  // start a garbage collection whose finalizers run Python code; the value is looked up after that,
  // so it is valid when returned, and stays valid until Python code runs. Inlined into the gathers'
  // loops: it runs once per field per request.
  C10_ALWAYS_INLINE PyObject* peek(PyObject* obj) {
    PyTypeObject* type = Py_TYPE(obj);
    // A class changed by a getter (a property added, say) gets a new version tag: look again. A
    // tag of 0 means CPython gave the class none, so it is looked up on every read.
    if (C10_UNLIKELY(type != type_ || type->tp_version_tag != version_tag_ || version_tag_ == 0)) classify(type);
    if (C10_UNLIKELY(!dict_first_)) return nullptr;
    PyObject* dict = PyObject_GenericGetDict(obj, nullptr);
    if (C10_UNLIKELY(dict == nullptr)) {
      PyErr_Clear();
      return nullptr;
    }
    PyObject* value = PyDict_GetItemWithError(dict, name_);  // borrowed: the dict holds it
    Py_DECREF(dict);  // the object holds the dict
    if (C10_UNLIKELY(value == nullptr)) PyErr_Clear();
    return value;
  }

  // obj.<name> as a strong reference, or empty (error cleared) when it cannot be read. The generic
  // lookup may run Python code (getters), which is why the value is held.
  C10_ALWAYS_INLINE Ref read(PyObject* obj) {
    if (PyObject* value = peek(obj)) return Ref::borrow(value);
    return read_generic(obj);
  }

 private:
  // The generic lookup: a name missing from the dict (a class default, __getattr__), or any class
  // whose dict Python would not read first.
  C10_NOINLINE Ref read_generic(PyObject* obj) {
    PyObject* value = PyObject_GetAttr(obj, name_);
    if (value == nullptr) PyErr_Clear();
    return Ref::steal(value);
  }

  C10_NOINLINE void classify(PyTypeObject* type) {
    Py_INCREF(type);  // held, so that no other type can take its address during the batch
    Py_XSETREF(type_, type);
    // _PyType_Lookup walks the MRO without running Python code (pybind11 relies on it too).
    PyObject* class_attr = _PyType_Lookup(type, name_);  // borrowed; gives the class a version tag
    version_tag_ = type->tp_version_tag;
    dict_first_ = type->tp_getattro == PyObject_GenericGetAttr &&
                  (class_attr == nullptr || Py_TYPE(class_attr)->tp_descr_set == nullptr);
  }

  PyObject* name_;
  PyTypeObject* type_ = nullptr;
  unsigned int version_tag_ = 0;
  bool dict_first_ = false;
};

// An exact list or tuple: its size and items (borrowed) without copying; false for any other type,
// subclasses included (their __iter__, __len__ or __getitem__ may not be what a direct read sees).
inline bool as_list_or_tuple(PyObject* obj, Py_ssize_t* size, PyObject*** items = nullptr) {
  if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj)) return false;
  *size = PySequence_Fast_GET_SIZE(obj);
  if (items != nullptr) *items = PySequence_Fast_ITEMS(obj);
  return true;
}

// Item i of a list or tuple that had n items, as a strong reference, read afresh: a property
// getter run for an earlier item may have resized or changed the list (a list, not a tuple).
// Empty when the list no longer has n items.
inline Ref item_at(PyObject* seq, Py_ssize_t n, Py_ssize_t i) {
  if (PySequence_Fast_GET_SIZE(seq) != n) return Ref();
  return Ref::borrow(PySequence_Fast_ITEMS(seq)[i]);
}

// An exact Python int (bool excluded) within int64.
inline bool exact_int(PyObject* obj, int64_t* out) {
  long long v = 0;
  if (!PyLong_CheckExact(obj) || !exact_int_value(obj, &v)) return false;
  *out = v;
  return true;
}

// An exact Python float, or an exact int that a double holds exactly: the number the Python
// builder's comparisons see.
inline bool exact_real(PyObject* obj, double* out) {
  if (PyFloat_CheckExact(obj)) {
    *out = PyFloat_AS_DOUBLE(obj);
    return true;
  }
  int64_t v = 0;
  constexpr int64_t kExactInDouble = int64_t{1} << 53;
  if (!exact_int(obj, &v) || v > kExactInDouble || v < -kExactInDouble) return false;
  *out = static_cast<double>(v);
  return true;
}

}  // namespace pinstage::builders

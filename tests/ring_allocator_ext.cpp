// A test-only extension (built by tests/test_ring_allocator.py): RingAllocator with fences that the
// test completes by hand, so the allocation rules are checked on machines without a GPU (the CUDA
// ring uses the same template).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <unordered_set>

#include "ring/ring_allocator.h"

namespace py = pybind11;

namespace pinstage {

class ManualFenceRing {
 public:
  explicit ManualFenceRing(size_t capacity) : ring_(capacity) {}

  // (offset, ticket) or None when there is no room.
  py::object reserve(size_t bytes, size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) throw py::value_error("alignment must be a power of two");
    auto r = ring_.try_reserve(bytes, alignment);
    if (!r) return py::none();
    return py::make_tuple(r->offset, r->ticket);
  }
  void seal(uint64_t ticket, int64_t marker, bool held) { ring_.seal(ticket, marker, held); }
  void unhold(uint64_t ticket) { ring_.unhold(ticket); }
  void abandon(uint64_t ticket) { ring_.abandon(ticket); }
  void complete(int64_t marker) { completed_.insert(marker); }
  size_t release_completed() {
    return ring_.release_completed([this](int64_t m) { return completed_.count(m) > 0; }, [](int64_t) {});
  }
  py::object oldest_marker() const {
    const int64_t* f = ring_.waitable_oldest_fence();
    return f ? py::object(py::int_(*f)) : py::none();
  }
  const RingAllocator<int64_t>& ring() const { return ring_; }

 private:
  RingAllocator<int64_t> ring_;
  std::unordered_set<int64_t> completed_;
};

}  // namespace pinstage

PYBIND11_MODULE(ring_allocator_ext, m) {
  using pinstage::ManualFenceRing;
  py::class_<ManualFenceRing>(m, "RingAllocator")
      .def(py::init<size_t>(), py::arg("capacity"))
      .def("reserve", &ManualFenceRing::reserve, py::arg("bytes"), py::arg("alignment") = 16)
      .def("seal", &ManualFenceRing::seal, py::arg("ticket"), py::arg("marker"), py::arg("held") = false)
      .def("unhold", &ManualFenceRing::unhold, py::arg("ticket"))
      .def("abandon", &ManualFenceRing::abandon, py::arg("ticket"))
      .def("complete", &ManualFenceRing::complete, py::arg("marker"))
      .def("release_completed", &ManualFenceRing::release_completed)
      .def("oldest_marker", &ManualFenceRing::oldest_marker)
      .def_property_readonly("capacity", [](const ManualFenceRing& r) { return r.ring().capacity(); })
      .def_property_readonly("in_flight_bytes", [](const ManualFenceRing& r) { return r.ring().in_flight_bytes(); })
      .def_property_readonly("peak_in_flight_bytes", [](const ManualFenceRing& r) { return r.ring().peak_in_flight_bytes(); })
      .def_property_readonly("wraps", [](const ManualFenceRing& r) { return r.ring().wraps(); })
      .def_property_readonly("pending_regions", [](const ManualFenceRing& r) { return r.ring().pending_regions(); });
}

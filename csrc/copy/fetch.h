// Fetches: device tensors copied into pinned ring memory without waiting, read through a handle.
//
// A fetch region is reused only when its copy has completed AND nothing reads it any more: the
// handle and every CPU tensor viewing its memory hold it, so a value read from a fetch can never be
// overwritten underneath the reader.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <memory>
#include <mutex>
#include <vector>

namespace pinstage {

class FetchHandle {
 public:
  // Copies `tensors` (any device tensors, or CPU tensors, which are copied at once) into one held
  // region on `stream` (None: the tensors' device's current stream), one copy per tensor. many:
  // fetch_many's handle (else fetch_to_host's, of one tensor), for its readers and messages.
  static std::shared_ptr<FetchHandle> start(const std::vector<at::Tensor>& tensors, PyObject* stream, bool many);
  ~FetchHandle();

  // Each may run while another thread releases the handle (wait() runs with the GIL released):
  // the region is taken under the handle's lock, and a reference keeps it while it is read.
  bool ready();                       // never waits
  void wait();                        // waits for this fetch's copies only; the caller may release the GIL
  std::vector<at::Tensor> tensors();  // CPU tensors over the held memory (waits first)
  void release();                     // the handle's hold; views keep theirs
  bool released() const;
  size_t count() const { return shapes_.size(); }
  bool many() const { return many_; }

  struct Region;  // a held lease; its destructor lets the ring reuse it

 private:
  // The held region (nullptr for a CPU fetch, whose values go to *host when given); RuntimeError
  // once released.
  std::shared_ptr<Region> held_region(std::vector<at::Tensor>* host = nullptr) const;

  mutable std::mutex mu_;  // guards region_, released_ and host_
  std::shared_ptr<Region> region_;
  bool released_ = false;
  bool many_ = false;
  std::vector<at::Tensor> host_;  // CPU inputs: the values, copied at start
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<c10::ScalarType> dtypes_;
  std::vector<size_t> offsets_;
};

}  // namespace pinstage

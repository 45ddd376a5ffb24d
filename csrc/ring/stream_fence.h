// StreamFence: the completion fence that consecutive copies on one stream share, recorded lazily.
// See Note [Ring design] in ring/staging_ring.h.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ring/event_pool.h"

namespace pinstage {

// Whether `stream` is capturing a CUDA graph (a non-blocking query).
inline bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

struct StreamFence {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;  // null while open (not yet recorded)
  uint32_t attached = 0;        // regions attached while open
  size_t bytes = 0;             // bytes of those regions
  uint32_t holders = 0;         // regions (ring or overflow) not yet released
  bool completed = false;       // its event was seen done: the fence's other regions ask no more
};

// Owns the fences of one device; the StagingRing that holds it serialises access and makes every
// call that reaches CUDA inside a RingCudaScope (ring/cuda_scope.h).
class StreamFences {
 public:
  static constexpr uint32_t kRegionsPerFence = 32;

  explicit StreamFences(EventPool& events) : events_(events) {}

  // An open fence is recorded once the regions attached to it hold this many bytes.
  void set_bytes_per_fence(size_t bytes) { bytes_per_fence_ = bytes; }
  StreamFences(const StreamFences&) = delete;
  StreamFences& operator=(const StreamFences&) = delete;

  // The fence a copy just enqueued on `stream` is covered by (recorded later: see due()).
  StreamFence* attach(cudaStream_t stream, size_t bytes) {
    StreamFence* f = nullptr;
    for (StreamFence* o : open_) {
      if (o->stream == stream) {
        f = o;
        break;
      }
    }
    if (f == nullptr) {
      f = take();
      f->stream = stream;
      open_.push_back(f);
    }
    ++f->attached;
    ++f->holders;
    f->bytes = bytes > SIZE_MAX - f->bytes ? SIZE_MAX : f->bytes + bytes;
    return f;
  }

  // Whether an open fence covers enough to be recorded now (see the top of this file). attach()
  // makes no CUDA call, so that a region is sealed before anything that can fail runs.
  bool due(const StreamFence* f) const {
    return f->event == nullptr && (f->attached >= kRegionsPerFence || f->bytes >= bytes_per_fence_);
  }

  void record(StreamFence* f) {
    cudaEvent_t e = events_.acquire();
    const cudaError_t err = cudaEventRecord(e, f->stream);
    if (err != cudaSuccess) events_.release(e);  // the fence stays open: the next check records it
    C10_CUDA_CHECK(err);
    ++records_;
    f->event = e;
    forget_open(f);
  }

  // Non-blocking: has every copy covered by `f` completed? Records an open fence first, unless its
  // stream is capturing a graph (a record there would become a graph node, not a real event). A
  // completed fence is remembered: its 32 regions are released with one cudaEventQuery, not 32.
  bool done(StreamFence* f) {
    if (f->completed) return true;
    if (f->event == nullptr) {
      if (stream_is_capturing(f->stream)) return false;
      record(f);
    }
    ++queries_;
    f->completed = event_done(f->event);
    return f->completed;
  }

  // An event to block on for `f` (recording it if still open), for on_full="wait"; nullptr while
  // an open fence's stream is capturing (the record would become a graph node).
  cudaEvent_t event_to_wait_on(StreamFence* f) {
    if (f->event == nullptr) {
      if (stream_is_capturing(f->stream)) return nullptr;
      record(f);
    }
    return f->event;
  }

  // cudaEventQuery and cudaEventRecord calls made: what a staging costs in driver calls (stats()).
  uint64_t queries() const { return queries_; }
  uint64_t records() const { return records_; }

  // One region covered by `f` was released.
  void release(StreamFence* f) {
    if (--f->holders > 0) return;
    if (f->event != nullptr)
      events_.release(f->event);
    else
      forget_open(f);
    *f = StreamFence{};
    free_.push_back(f);
  }

 private:
  void forget_open(StreamFence* f) {
    for (size_t i = 0; i < open_.size(); ++i) {
      if (open_[i] == f) {
        open_[i] = open_.back();
        open_.pop_back();
        return;
      }
    }
  }

  StreamFence* take() {
    if (!free_.empty()) {
      StreamFence* f = free_.back();
      free_.pop_back();
      return f;
    }
    all_.push_back(std::make_unique<StreamFence>());
    return all_.back().get();
  }

  EventPool& events_;
  size_t bytes_per_fence_ = 0;
  uint64_t queries_ = 0;
  uint64_t records_ = 0;
  std::vector<std::unique_ptr<StreamFence>> all_;
  std::vector<StreamFence*> free_;
  std::vector<StreamFence*> open_;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA

// The docstrings of the staging and fetch functions that pinstage exports as they are (pinstage/_api.py)
// and of the fetch handle.
// Each begins with the signature that inspect.signature reads (CPython's __text_signature__).
#pragma once

namespace pinstage {

inline constexpr const char* kStageToDeviceDoc = R"doc(stage_to_device(data, dtype, stream=None, *, device=None)
--

torch.tensor(data, dtype=dtype) on the GPU, without waiting for it.

The values are converted straight into pinned ring memory and moved by one asynchronous copy on
`stream` (default: the device's current stream); the result comes from PyTorch's caching
allocator on that stream. Device: the stream's, else `device`, else the current CUDA device,
else the CPU (an ordinary CPU tensor).

data: Python ints, floats, bools, (nested) lists and tuples of them, range, numpy arrays and
scalars, array.array, memoryview, bytearray, CPU tensors. The result equals
torch.tensor(data, dtype=dtype) in values, dtype and shape; where torch.tensor raises,
pinstage raises the same exception type with the offending element's index, value and dtype.
Raises TypeError for an unsupported dtype or for tensor data whose storage does not hold its
values and that torch.tensor cannot turn into one that does (FakeTensor, quantized, nested);
RuntimeError when `stream` is capturing a CUDA graph,
RingFullError when the ring is full and on_full="error".)doc";

inline constexpr const char* kStageManyDoc = R"doc(stage_many(items, stream=None, *, device=None)
--

[(data, dtype), ...] -> [tensor, ...], as stage_to_device each, in ONE copy.

Every item goes into one ring region (each 16-byte aligned) and one device allocation, moved by
one host-to-device copy; the results are views of that allocation with the requested dtypes
and shapes. An error names the item (`item 3: ...`) and stages nothing.)doc";

inline constexpr const char* kStagePrefillDoc =
    R"doc(_stage_prefill(items, extend_lens, logprob_starts, req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, out_cache_loc, stream, device)
--

pinstage.builders.stage_prefill's compiled call (use that): the items and the four logits index
arrays in one copy, and req_to_token's rows from the item out_cache_loc (on a device, one kernel launch does both). None where a
per-request column is not a list of Python ints.)doc";

inline constexpr const char* kStageIntoDoc = R"doc(stage_into(data, out, stream=None)
--

Fills the existing contiguous tensor `out` with data converted to out.dtype; returns `out`.

data must have out.numel() elements (any shape). One asynchronous copy on `stream` (default:
the current stream of out's device); for a CUDA graph's static inputs, call it before
graph.replay(). A conversion error leaves `out` as it was. out must hold its values in its own
storage: a tensor subclass, FakeTensor or zero tensor is refused (TypeError), a neg view too
(ValueError).)doc";

inline constexpr const char* kStaticInputsStageDoc = R"doc(_static_inputs_stage(inputs, values, n, stream)
--

StaticInputs.stage's core: see pinstage.StaticInputs.stage.)doc";

inline constexpr const char* kFetchToHostDoc = R"doc(fetch_to_host(tensor, stream=None)
--

Copies a device tensor into pinned ring memory on `stream` (default: its device's current
stream) and returns at once with a FetchHandle. The copy waits for nothing but work already
queued on that stream; the source tensor may be freed right after the call.
A CPU tensor gives a handle over a copy of it, ready at once. Conjugate and negative views
come back resolved; a quantized tensor, or one without memory of its own (a tensor subclass
wrapping others, a fake or zero tensor, a nested tensor), raises TypeError.)doc";

inline constexpr const char* kFetchManyDoc = R"doc(fetch_many(tensors, stream=None)
--

fetch_to_host for several tensors of one device: one ring region, one fence, one copy per
tensor; handle.tensors() gives them in order.)doc";

inline constexpr const char* kFetchHandleDoc =
    R"doc(A device-to-host copy into pinned ring memory, returned at once by fetch_to_host/fetch_many.

ready() says whether the copy has completed (never waits); wait() waits for this copy only;
tensor()/tensors(), numpy() and tolist() give the values (waiting first if needed). The memory is
reused only when the copy has completed and the handle has been released (release(), the end of
a `with` block, or garbage collection) and no tensor or array from it is alive: a value read from
a handle is never overwritten underneath the reader. Copy out (`.clone()`) what you keep long,
so that the ring can reuse its memory. A handle may be shared by threads: release() while
another thread waits lets that wait finish (or raise RuntimeError if it had not begun).)doc";

inline constexpr const char* kFetchReadyDoc = "Whether the copy has completed; never waits.";
inline constexpr const char* kFetchWaitDoc =
    "Waits (GIL released) for this fetch's copy and returns the handle; raises inside pinstage.testing.no_sync().";
inline constexpr const char* kFetchTensorsDoc = "CPU tensors over the fetched memory, one per fetched tensor.";
inline constexpr const char* kFetchTensorDoc = "The CPU tensor of a single fetch (fetch_to_host).";
inline constexpr const char* kFetchNumpyDoc =
    R"doc(The fetched values as numpy arrays over the pinned memory (no copy), waiting for the copy
first if it has not completed: one array for fetch_to_host, a list of them for fetch_many.
The ring keeps the memory while an array is alive; `.copy()` what you keep long.)doc";
inline constexpr const char* kFetchTolistDoc =
    R"doc(The fetched values as (nested) Python lists, waiting for the copy first if it has not
completed: one list for fetch_to_host, a list of them for fetch_many. The lists are copies:
nothing holds the ring's memory afterwards.)doc";
inline constexpr const char* kFetchReleaseDoc =
    "Lets the ring reuse the memory once the copy has completed (tensors from it keep it).";

}  // namespace pinstage

// The docstrings of the staging functions that pinstage exports as they are (pinstage/_api.py).
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

}  // namespace pinstage

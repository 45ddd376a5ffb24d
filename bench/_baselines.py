"""The ways engines copy host state to the device today, as the benchmarks time them beside pinstage."""

import warnings

import numpy as np
import torch

import pinstage

COPIES = ("pinstage", "pinned", "blocking")

# pinned_host reads BatchState's read-only column views through torch.from_numpy, which warns that
# it cannot protect them; the tensor is only read, and a copy or a per-call filter would bill the
# baseline for it.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def stage(items, copy, device):
    """[(values, dtype), ...] -> [tensor, ...] on `device`, each equal to torch.tensor(values,
    dtype=dtype), copied one of three ways: "pinstage" (one stage_many: one ring region, one copy),
    "pinned" (a pinned host tensor per item, copied without waiting) or "blocking" (a pageable
    tensor per item, a copy the host waits for). values: lists, numpy arrays or CPU tensors."""
    if copy == "pinstage":
        return pinstage.stage_many(items, device=device)
    if copy not in COPIES:
        raise ValueError("copy must be one of %s, got %r" % (COPIES, copy))
    device = torch.device(device)
    if device.type == "cpu":
        return [torch.as_tensor(values, dtype=dtype).clone() for values, dtype in items]
    if copy == "pinned":
        return [
            torch.as_tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True) for values, dtype in items
        ]
    return [torch.as_tensor(values, dtype=dtype).to(device) for values, dtype in items]


class CpuGpuBuffer:
    """vLLM's CpuGpuBuffer (vllm/v1/utils.py): a persistent pinned host tensor, its numpy view and the
    persistent device tensor it feeds; copy_to_gpu(n) copies the first n rows without waiting. The
    host rewrites the same pinned memory every step whether or not the last copy has read it: unsafe
    on reuse, for timing only."""

    def __init__(self, gpu):
        self.gpu = gpu
        self.cpu = torch.empty(gpu.shape, dtype=gpu.dtype, pin_memory=gpu.is_cuda)
        self.np = self.cpu.numpy()

    @classmethod
    def empty(cls, size, dtype, device):
        return cls(torch.empty(size, dtype=dtype, device=device))

    def copy_to_gpu(self, n):
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)

    def write(self, values):
        """The values (a numpy array or list) into the host buffer, then copy_to_gpu."""
        n = len(values)
        self.np[:n] = values
        return self.copy_to_gpu(n)


def pinned_host(values, dtype, pin=True):
    """A fresh (pinned) host tensor of the values, a list or a numpy column, as engines make one per
    field. torch.tensor(array, pin_memory=True) raises on some torch versions ("Can't pin tensor
    constructed from numpy"), so an array is pinned by one copy of its own."""
    if isinstance(values, np.ndarray):
        t = torch.from_numpy(values).to(dtype)
        return t.pin_memory() if pin else t
    return torch.tensor(values, dtype=dtype, pin_memory=pin)


def pinned_tensor(values, dtype, device):
    """SGLang's per-field pattern: a fresh pinned tensor from the values (a list or numpy column),
    copied without waiting. Safe: torch's pinned allocator reuses the block only after the copy."""
    device = torch.device(device)
    return pinned_host(values, dtype, pin=device.type == "cuda").to(device, non_blocking=True)


def allocation_bytes(inputs):
    """A byte tensor over the one allocation behind every view of a pinstage.StaticInputs."""
    views = [inputs[name] for name in inputs.names]
    storage = views[0].untyped_storage()
    assert all(v.untyped_storage().data_ptr() == storage.data_ptr() for v in views), "not one allocation"
    return torch.empty(0, dtype=torch.uint8, device=views[0].device).set_(storage)


class PackedPinnedBuffer:
    """The unguarded single copy: a persistent pinned mirror of a pinstage.StaticInputs allocation,
    written and copied by StaticInputs' own rule: every field's n rows, its fill in rows n..max_bs,
    and ONE copy of the bytes up to the last field's rows that may differ from its fill (n, or more
    right after a larger batch). The same bytes StaticInputs copies, without the ring: the host
    rewrites the buffer every step whether or not the last copy has read it. Unsafe on reuse, for
    timing only. fills: field name -> fill value."""

    def __init__(self, inputs, fills):
        views = [inputs[name] for name in inputs.names]
        self.whole = allocation_bytes(inputs)
        self.host = torch.empty(self.whole.shape, dtype=torch.uint8, pin_memory=self.whole.is_cuda)
        host = self.host.numpy()
        base = self.whole.data_ptr()
        self.columns = {}
        for name, view in zip(inputs.names, views):
            start = view.data_ptr() - base
            dtype = torch.empty(0, dtype=view.dtype).numpy().dtype
            self.columns[name] = host[start : start + view.nbytes].view(dtype).reshape(view.shape)
        self.fills = {name: fills[name] for name in inputs.names}
        last = views[-1]
        self.last_start, self.last_row_bytes = last.data_ptr() - base, last.nbytes // len(last)
        self.dirty = len(last)  # rows of the last field that may not hold its fill on the device

    def write(self, values, n):
        for name, column in self.columns.items():
            column[:n] = values[name]
            column[n:] = self.fills[name]
        end = self.last_start + max(n, self.dirty) * self.last_row_bytes
        self.whole[:end].copy_(self.host[:end], non_blocking=True)
        self.dirty = n

"""What pinstage.StaticInputs' views must hold, kept on the CPU beside them by test_static_inputs and
test_static_inputs_rows: a stage() writes rows [0, n) of each non-persistent field as
torch.tensor(values, dtype=field.dtype) and rows [n, max_bs) as its fill, then applies the row
writes kept since the last stage with torch indexing."""

import torch
from staging_reference import expected

from pinstage import StaticInputs


class Reference:
    def __init__(self, fields, max_bs):
        self.fields = fields
        self.tensors = {name: torch.full((max_bs,) + f.shape, f.fill, dtype=f.dtype) for name, f in fields.items()}
        self.pending = []

    def write_rows(self, name, rows, starts, values):
        dtype = self.fields[name].dtype
        for row, start, v in zip(rows, starts, values):
            t, exc = expected(v, dtype)
            assert exc is None, exc
            self.pending.append((name, int(row), int(start), t))

    def stage(self, values, n):
        for name, f in self.fields.items():
            if f.persistent:
                continue
            rows, exc = expected(values[name], f.dtype)
            assert exc is None, "torch.tensor refuses the test's values for %s: %r" % (name, exc)
            self.tensors[name][:n] = rows.reshape((n,) + f.shape)
            self.tensors[name][n:] = f.fill
        for name, row, start, t in self.pending:
            self.tensors[name][row].view(-1)[start : start + t.numel()] = t
        self.pending = []

    def snapshot(self):
        return {name: t.clone() for name, t in self.tensors.items()}


def maker(default_fields):
    """A test module's make(device, max_bs=16, fields=default_fields) -> (StaticInputs, its Reference)."""

    def make(device, max_bs=16, fields=default_fields):
        return StaticInputs(fields, max_bs=max_bs, device=device), Reference(fields, max_bs)

    return make


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()

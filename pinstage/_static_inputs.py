"""pinstage.StaticInputs: a CUDA graph's static inputs in one allocation, filled by one copy per step."""

import operator
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import _C
from ._api import Device

# A Python dispatch mode (FakeTensorMode) must not see the fills: the core reads their bytes.
_PYTHON_DISPATCH = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.PythonTLSSnapshot
)
_INT64_MAX = 2**63 - 1


class _FieldTuple(NamedTuple):
    dtype: torch.dtype
    shape: Tuple[int, ...] = ()
    fill: Union[int, float, bool] = 0
    persistent: bool = False


class Field(_FieldTuple):
    """One static input: its dtype, the shape of one row, and the value of the rows a stage leaves
    unused (rows n..max_bs: the padding a graph's batch bucket reads). A dtype that is not a torch
    dtype pinstage stages raises TypeError here (np.int64: "use torch.int64").

    persistent=True: the field keeps its rows from step to step (a block table): stage() takes no
    values for it and its rows change only by StaticInputs.write_rows (fill until then)."""

    __slots__ = ()

    def __new__(
        cls,
        dtype: torch.dtype,
        shape: Tuple[int, ...] = (),
        fill: Union[int, float, bool] = 0,
        persistent: bool = False,
    ) -> "Field":
        _C._check_dtype(dtype, "Field dtype")
        return super().__new__(cls, dtype, shape, fill, bool(persistent))


class StaticInputs:
    """Named fields of ONE device allocation, each a view [max_bs, *shape] (16-byte aligned) that a
    CUDA graph captures as its static input; stage() fills them all with ONE host-to-device copy.

        inputs = StaticInputs({"input_ids": Field(torch.int64),
                               "temperatures": Field(torch.float32, (1,), fill=1.0)}, max_bs=256)
        with torch.cuda.graph(graph):
            out = step(inputs["input_ids"], inputs["temperatures"])
        inputs.stage({"input_ids": ids, "temperatures": temps}, n=len(ids))   # then graph.replay()

    Every row holds its field's fill from construction on (one copy on the device's current stream).
    device: as for stage_to_device (None: the current CUDA device, else the CPU); torch's default
    device (torch.set_default_device, `with torch.device(...)`) does not choose it. The allocation is
    real memory under a Python dispatch mode too (FakeTensorMode), as stage_to_device's results are.
    On the CPU (no CUDA) the views are ordinary CPU tensors that stage() writes directly.
    One StaticInputs is one set of graph inputs: stage it from one thread at a time.
    """

    __slots__ = ("_core", "_views", "_names", "_staged_names", "_max_bs", "__weakref__")

    def __init__(self, fields: Mapping[str, Field], max_bs: int, device: Device = None):
        if not isinstance(fields, Mapping):
            raise TypeError(
                "pinstage.StaticInputs: fields must be a dict of name -> Field, got %s" % type(fields).__name__
            )
        specs = [_field_spec(name, field) for name, field in fields.items()]
        self._max_bs = operator.index(max_bs)
        if not 0 < self._max_bs <= _INT64_MAX:
            raise ValueError("pinstage.StaticInputs: max_bs must be between 1 and 2**63 - 1, got %d" % self._max_bs)
        self._core = _C.StaticInputs(specs, self._max_bs, device)
        self._views: Dict[str, torch.Tensor] = dict(zip(fields, self._core.views()))
        self._names = tuple(self._views)
        self._staged_names = tuple(name for name in self._names if not fields[name].persistent)

    def stage(self, values: Dict[str, Any], n: int, stream: Optional[torch.cuda.Stream] = None) -> None:
        """Writes every field's n rows of values and the fill into rows n..max_bs, by ONE copy on
        `stream` (default: the device's current stream) from one staging ring region laid out like
        the allocation; returns before the copy has run. Then the row writes kept since the last
        stage are applied (over this step's values: a row write wins), by ONE kernel on `stream`
        that reads them from the same ring region, so anything later on the stream sees them.

        values: a dict with the values of every field but the persistent ones, each with n rows'
        elements (lists, numpy arrays, CPU tensors: anything stage_to_device takes), converted as
        torch.tensor(v, dtype=field.dtype) would. A missing field raises KeyError, an unknown or
        persistent one ValueError; a bad value raises what torch.tensor raises, naming the field.
        After any error nothing was staged and the row writes are still pending. A stream that is
        capturing a CUDA graph raises RuntimeError: stage before graph.replay(), outside the capture.
        """
        _C._static_inputs_stage(self._core, values, n, stream)

    def write_rows(self, name: str, rows: Sequence[int], starts: Sequence[int], values: Sequence[Any]) -> None:
        """Keeps writes for the next stage(): for each i, values[i] (a 1-D sequence of any length,
        converted as torch.tensor(values[i], dtype=field.dtype)) goes to field `name`'s row rows[i]
        (its elements flattened) from element starts[i] on, as
        `inputs[name][rows[i]].view(-1)[starts[i]:starts[i] + len(values[i])] = values[i]` would.
        Writes land in call order (a later one wins where they overlap). A persistent field keeps
        them from then on; any other field is rewritten whole by the stage after next.

        Nothing reaches the device here: a bad write (unknown field, row or start out of range,
        values running past the row, a value the dtype cannot hold) raises naming the field, the
        write and the value, and nothing of this call is kept (earlier writes stay pending)."""
        self._core.write_rows(name, rows, starts, values)

    @property
    def pending_writes(self) -> int:
        """How many row writes the next stage() applies."""
        return self._core.pending_writes

    def __getitem__(self, name: str) -> torch.Tensor:
        """The field's view [max_bs, *shape]: the static input a CUDA graph captures."""
        return self._views[name]

    @property
    def names(self) -> Tuple[str, ...]:
        return self._names

    @property
    def staged_names(self) -> Tuple[str, ...]:
        """The fields stage() takes values for: every field but the persistent ones."""
        return self._staged_names

    @property
    def max_bs(self) -> int:
        return self._max_bs

    @property
    def device(self) -> torch.device:
        return self._core.device

    def __repr__(self):
        fields = ", ".join(
            "%s: %s%s" % (name, str(v.dtype).replace("torch.", ""), list(v.shape)) for name, v in self._views.items()
        )
        return "<pinstage.StaticInputs max_bs=%d on %s: %s>" % (self._max_bs, self.device, fields)


def _field_spec(name, field):
    """(name, dtype, row shape, fill as a 0-d CPU tensor, persistent): the fill converted by torch's own rules
    (as tensor.fill_ converts it), so a value the dtype cannot hold raises here, naming the field.
    The fill is a real CPU tensor whatever the default device or dispatch mode: the core reads its
    bytes."""
    if not isinstance(name, str):
        raise TypeError("pinstage.StaticInputs: field names must be str, got %s" % type(name).__name__)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "pinstage.StaticInputs: field name %r is not valid text (it holds a lone surrogate)" % name
        ) from None
    if "\x00" in name:  # error messages are C strings: the name would be cut there
        raise ValueError("pinstage.StaticInputs: field name %r holds a NUL character" % name)
    if not isinstance(field, Field):
        raise TypeError(
            "pinstage.StaticInputs: field '%s' must be a pinstage.Field, got %s" % (name, type(field).__name__)
        )
    _C._check_dtype(field.dtype, "field '%s' dtype" % name)  # again: Field._replace skips Field()
    try:
        shape = tuple(operator.index(s) for s in field.shape)
    except TypeError:
        raise TypeError(
            "pinstage.StaticInputs: field '%s': shape must be a tuple of ints, got %r" % (name, field.shape)
        ) from None
    if any(not 0 <= s <= _INT64_MAX for s in shape):
        raise ValueError(
            "pinstage.StaticInputs: field '%s': shape %r: each dimension must be between 0 and "
            "2**63 - 1" % (name, shape)
        )
    try:
        with torch._C._ExcludeDispatchKeyGuard(_PYTHON_DISPATCH):
            fill = torch.full((), field.fill, dtype=field.dtype, device="cpu")
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
        raise type(exc)("pinstage.StaticInputs: field '%s': fill %r: %s" % (name, field.fill, exc)) from None
    return name, field.dtype, shape, fill, bool(field.persistent)

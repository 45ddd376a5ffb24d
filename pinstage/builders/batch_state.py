"""BatchState: a running batch's per-request values in persistent numpy columns.

The per-step builders over a list of requests read every request's fields every step. An engine
that keeps this state instead (vLLM's InputBatch idea) writes a request's fields once, when it
joins, compacts the columns when requests leave, and updates the last token and length of the
whole batch at once when sampled tokens come back; a step is then one stage_many of column slices:
one ring region and one copy, whatever the batch size. pinstage's ring is what makes reusing the
host memory behind those copies safe: the columns are never the copy's source, the ring is.
"""

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt
import torch

import pinstage
from pinstage import _C, StaticInputs
from pinstage._api import Device

from ._checks import NamedValues, is_integer_entry, plain_int_array
from ._fields import TOKEN_FIELDS, lacks_field, penalty_row, pool_row
from .decode import DecodeInputs
from .protocols import BatchRequest
from .requests import NO_PENALTIES, check_sampling_fields
from .sampling import DEFAULT_SAMPLING_SEED, SamplingBatch, sampling_flags
from .static_step import column_views, static_values

# name -> (numpy dtype, shape of one row)
_COLUMNS: Dict[str, Tuple[type, Tuple[int, ...]]] = {
    "last_token_ids": (np.int64, ()),
    "seq_lens": (np.int64, ()),
    "req_pool_indices": (np.int64, ()),
    "temperatures": (np.float32, ()),
    "top_ps": (np.float32, ()),
    "top_ks": (np.int32, ()),
    "min_ps": (np.float32, ()),
    "seeds": (np.int64, ()),
    "penalties": (np.float32, (3,)),  # frequency, presence, repetition
    # Per request, from its Python values (as the list builders see them): sampling_flags, then
    # "some penalty set". Their sums are the batch's counters.
    "flags": (np.bool_, (5,)),  # see _FLAGS
}
_INT64 = (-(2**63), 2**63 - 1)
# Slots of the batch: ints (a list, a numpy array or a CPU tensor).
Slots = Union[Sequence[int], npt.NDArray[np.integer[Any]], torch.Tensor]
_MASK_HINT = " (a boolean mask is not accepted: pass np.flatnonzero(mask))"


# The flags column, in sampling_flags' order and then the penalties: a request's contribution to
# is_all_greedy, need_top_p, need_top_k, need_min_p and need_penalties.
_FLAGS = _GREEDY, _TOP_P, _TOP_K, _MIN_P, _PENALTIES = range(5)


class BatchState:
    """The requests of a running batch, one row ("slot") each, in batch order.

    `add(request)` writes one request's fields (pinstage's Request, SGLang's Req, or any object with
    the fields of protocols.BatchRequest) and returns its slot; `filter(keep)` / `remove(slots)` compact the
    batch; `merge(other)` appends another state's requests; `append_tokens(tokens)` records one
    sampled token per request. The per-step builders (`decode_inputs`, `penalty_last_token_ids`,
    `sampling_batch`) each stage their tensors with one `pinstage.stage_many` and give the same
    tensors as the list-of-requests builders on the same requests. The sampling flags come from
    counters kept by add/filter/merge, not from a scan per step, and `sampling_batch` stages its
    tensors again only after the membership changed. `stage_static(inputs)` fills a CUDA graph's
    static inputs (pinstage.StaticInputs) with all of a step's fields in one copy.

    `requests` lists the request objects in slot order, for the engine's own bookkeeping; the state
    never reads them after `add` (append_tokens does not append to their output_ids).
    """

    def __init__(self, capacity: int = 64) -> None:
        self._size = 0
        self._cols: Dict[str, npt.NDArray[Any]] = {
            name: np.zeros((max(1, capacity),) + row, dtype) for name, (dtype, row) in _COLUMNS.items()
        }
        self.requests: List[BatchRequest] = []
        self._flag_counts = np.zeros(len(_FLAGS), dtype=np.int64)  # the flags column summed over the batch
        # The sampling tensors change only with membership: staged once per membership version
        # (and per seeds / device / stream asked for), not every step. vLLM's InputBatch does the same.
        self._version = 0
        self._staged: Optional[Tuple[Tuple[Any, ...], SamplingBatch]] = None
        # stage_static's column views, made again only with membership (and per field names).
        self._views: Optional[Tuple[Tuple[Any, ...], Dict[str, npt.NDArray[Any]], Tuple[str, ...]]] = None

    def __len__(self) -> int:
        return self._size

    def column(self, name: str) -> npt.NDArray[Any]:
        """A read-only view of one column over the batch (see _COLUMNS for the names)."""
        view = self._cols[name][: self._size]
        view.flags.writeable = False
        return view

    # ----------------------------------------------------------------------------- membership

    def add(self, request: BatchRequest) -> int:
        """Append one request; returns its slot. Reads (BatchRequest: SGLang's Req has them all)
        origin_input_ids, output_ids, the req_to_token row at `req_pool_idx` or (SGLang 0.5.23)
        `kv.req_pool_idx`, and sampling_params' temperature, top_p, top_k, min_p, sampling_seed and
        three penalties. Raises (naming the field) for a request without tokens, a row that is not
        an int >= 0, or sampling parameters that are not valid, TypeError for an object that lacks
        a field; the state is unchanged then."""
        missing = lacks_field("BatchState.add", request, TOKEN_FIELDS + ("sampling_params",), "a request")
        if missing is not None:
            raise missing
        tokens = request.output_ids or request.origin_input_ids
        if not len(tokens):
            raise ValueError("BatchState.add: origin_input_ids and output_ids are both empty, so it has no last token")
        last = _checked_int("BatchState.add", "last token id", tokens[-1], *_INT64)
        row = _checked_int("BatchState.add", "req_pool_idx", pool_row("BatchState.add", request), 0, _INT64[1])
        params = request.sampling_params
        check_sampling_fields(params, "BatchState.add: sampling_params")
        _check_fits_column("top_k", params.top_k, "top_ks")
        temperature = _checked_float("temperature", params.temperature)  # the one field that may be a huge int
        penalties = penalty_row(params)
        slot = self._size
        self._reserve(slot + 1)
        c = self._cols
        c["last_token_ids"][slot] = last
        c["seq_lens"][slot] = len(request.origin_input_ids) + len(request.output_ids)
        c["req_pool_indices"][slot] = row
        c["temperatures"][slot] = temperature
        c["top_ps"][slot] = params.top_p
        c["top_ks"][slot] = params.top_k
        c["min_ps"][slot] = params.min_p
        c["seeds"][slot] = DEFAULT_SAMPLING_SEED if params.sampling_seed is None else params.sampling_seed
        c["penalties"][slot] = penalties
        flags = sampling_flags(params.top_p, params.top_k, params.top_k, params.min_p) + (penalties != NO_PENALTIES,)
        c["flags"][slot] = flags
        self._flag_counts += flags
        self.requests.append(request)
        self._size = slot + 1
        self._version += 1
        return slot

    def filter(self, keep: Slots) -> None:
        """Keep the slots listed in `keep` (distinct ints, in the order given: usually ascending,
        which keeps batch order) and drop the others; kept requests get slots 0..len(keep)-1.
        TypeError for anything but integer slots (a boolean mask included), IndexError for a slot
        outside the batch; the state is unchanged then."""
        keep = self._checked_slots(keep, "filter")
        n = self._size
        kept = np.zeros(n, dtype=bool)
        kept[keep] = True
        if int(kept.sum()) != keep.size:
            raise ValueError("BatchState.filter: keep lists a slot more than once")
        self._flag_counts -= self._cols["flags"][:n][~kept].sum(axis=0)
        for col in self._cols.values():
            col[: keep.size] = col[keep]  # fancy indexing copies first, so overlapping moves are safe
        self.requests = [self.requests[i] for i in keep.tolist()]
        self._size = keep.size
        self._version += 1

    def remove(self, slots: Slots) -> None:
        """Drop the given slots (ints, as for filter), keeping the others in batch order."""
        dropped = np.zeros(self._size, dtype=bool)
        dropped[self._checked_slots(slots, "remove")] = True
        self.filter(np.flatnonzero(~dropped))

    def _checked_slots(self, slots: Slots, method: str) -> npt.NDArray[np.int64]:
        """Integer slots inside the batch as an int64 array. A boolean mask is refused, not read as
        slots 0 and 1 (TypeError: pass np.flatnonzero(mask)), and so are floats and strings; the
        check is on the values given, before any conversion that could wrap or truncate them."""
        if isinstance(slots, torch.Tensor):
            slots = slots.numpy()
        if isinstance(slots, np.ndarray) and slots.ndim != 1:
            raise ValueError(f"BatchState.{method}: slots must be a 1-D list of ints, got shape {slots.shape}")
        plain = plain_int_array(slots)  # the usual list
        if plain is not None:
            slots = plain
        elif not isinstance(slots, np.ndarray) or slots.dtype.kind == "O":
            entries = list(slots)
            for i, value in enumerate(entries):
                if not is_integer_entry(value):
                    raise TypeError(
                        f"BatchState.{method}: slots must be ints, got {type(value).__name__} {value!r} at index {i}"
                        + _MASK_HINT * isinstance(value, (bool, np.bool_))
                    )
            slots = _int_array([int(v) for v in entries])  # numpy would make [np.uint64(0), 1] float64
        values = slots
        if not values.size:
            return np.zeros(0, dtype=np.int64)
        if values.dtype.kind not in "iuO":  # "O": checked Python ints beyond int64
            raise TypeError(
                f"BatchState.{method}: slots must be ints, got dtype {values.dtype}"
                + _MASK_HINT * (values.dtype.kind == "b")
            )
        n = self._size
        outside = (values < 0) | (values >= n)
        if outside.any():
            bad = values[outside][0]
            raise IndexError(f"BatchState.{method}: slot {int(bad)} is outside the batch of {n}")
        return values.astype(np.int64)

    def merge(self, other: "BatchState") -> None:
        """Append every request of `other` after this state's, in its order."""
        if not isinstance(other, BatchState):
            raise TypeError(f"BatchState.merge: expected a BatchState, got {type(other).__name__}")
        n, m = self._size, other._size
        self._reserve(n + m)
        for name, col in self._cols.items():
            col[n : n + m] = other._cols[name][:m]
        self._flag_counts += other._flag_counts
        self.requests.extend(other.requests)
        self._size = n + m
        self._version += 1

    def append_tokens(self, tokens: Union[npt.NDArray[np.integer[Any]], torch.Tensor, Sequence[int]]) -> None:
        """One sampled token per request, in slot order (a numpy array or CPU tensor of ints; a list
        works too): each becomes its request's last token and its length grows by one. A token
        beyond int64 is refused (ValueError), as add() refuses it, not wrapped to a negative id; the
        state is unchanged then."""
        where = "BatchState.append_tokens"
        given = tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens
        n = self._size
        if isinstance(given, np.ndarray):
            values = given
        else:
            entries = list(given)
            if len(entries) != n:
                raise ValueError(f"{where}: expected {n} tokens (one per request), got {len(entries)}")
            plain = plain_int_array(entries)  # the usual list
            if plain is None:  # each entry checked as given, then converted
                plain = np.array([_checked_int(where, f"token {i}", v, *_INT64) for i, v in enumerate(entries)])
            values = plain
        if values.shape != (n,):
            raise ValueError(f"{where}: expected {n} tokens (one per request), got shape {values.shape}")
        if values.dtype.kind not in "iu":
            raise TypeError(f"{where}: tokens must be integers, got {values.dtype}")
        if values.dtype == np.uint64 and n and values.max() > _INT64[1]:
            i = int(np.argmax(values > _INT64[1]))
            _checked_int(where, f"token {i}", int(values[i]), *_INT64)
        self._cols["last_token_ids"][:n] = values
        self._cols["seq_lens"][:n] += 1

    # ----------------------------------------------------------------------------- flags

    def _flags(self) -> Tuple[bool, bool, bool, bool, bool]:
        """(is_all_greedy, need_top_p, need_top_k, need_min_p, need_penalties), in _FLAGS' order,
        from the counters in one numpy call."""
        greedy, top_p, top_k, min_p, penalties = self._flag_counts.tolist()
        return greedy == self._size, top_p > 0, top_k > 0, min_p > 0, penalties > 0

    @property
    def is_all_greedy(self) -> bool:
        return self._flags()[_GREEDY]

    @property
    def need_top_p(self) -> bool:
        return self._flags()[_TOP_P]

    @property
    def need_top_k(self) -> bool:
        return self._flags()[_TOP_K]

    @property
    def need_min_p(self) -> bool:
        return self._flags()[_MIN_P]

    @property
    def need_penalties(self) -> bool:
        return self._flags()[_PENALTIES]

    # ----------------------------------------------------------------------------- per step

    def decode_inputs(self, *, stream: Optional[torch.cuda.Stream] = None, device: Device = None) -> DecodeInputs:
        """DecodeInputs (input_ids, seq_lens, req_pool_indices: int64 [bs]) in one copy."""
        n, c = self._size, self._cols
        return DecodeInputs(
            *pinstage.stage_many(
                [
                    (c["last_token_ids"][:n], torch.int64),
                    (c["seq_lens"][:n], torch.int64),
                    (c["req_pool_indices"][:n], torch.int64),
                ],
                stream,
                device=device,
            )
        )

    def penalty_last_token_ids(
        self, *, stream: Optional[torch.cuda.Stream] = None, device: Device = None
    ) -> torch.Tensor:
        """int64 [bs]: each request's last token."""
        return pinstage.stage_to_device(self._cols["last_token_ids"][: self._size], torch.int64, stream, device=device)

    def sampling_batch(
        self,
        *,
        enable_deterministic_sampling: bool = False,
        stream: Optional[torch.cuda.Stream] = None,
        device: Device = None,
    ) -> SamplingBatch:
        """SamplingBatch (as build_sampling_batch gives it) in one copy, made again only after
        add/filter/remove/merge or for other arguments: until then every call returns the same
        SamplingBatch, whose tensors the caller must treat as read-only."""
        target = _C.target_device(stream, device)
        # Keyed on the stream the copy is ordered on: another stream must not read it unordered.
        on_stream = stream if stream is not None or target.type != "cuda" else torch.cuda.current_stream(target)
        key = (self._version, enable_deterministic_sampling, target, on_stream)
        if self._staged is not None and self._staged[0] == key:
            return self._staged[1]
        fields, make_batch = self.sampling_fields(enable_deterministic_sampling)
        batch = make_batch(
            pinstage.stage_many([(values, dtype) for _, values, dtype in fields], on_stream, device=target)
        )
        self._staged = (key, batch)
        return batch

    def sampling_fields(
        self, enable_deterministic_sampling: bool = False
    ) -> Tuple[List[NamedValues], Callable[[Sequence[torch.Tensor]], SamplingBatch]]:
        """The SamplingBatch's host values as builders.sampling_fields gives them for the same
        requests ((name, column slice, dtype) fields and the function that makes the SamplingBatch
        of their tensors, staged in that order), for a caller that stages them with other lists in
        one stage_many: a prefill batch's own BatchState, before it merges into the running one.
        The values were checked by add(); the flags come from the batch's counters. They are views
        of the state's own columns, not copies (read-only views cost more than the slices in a
        scheduler step): stage them before the state changes, and do not write them."""
        n, c = self._size, self._cols
        fields: List[NamedValues] = [
            ("temperature", c["temperatures"][:n, None], torch.float32),  # [n, 1], as SamplingBatch holds it
            ("top_p", c["top_ps"][:n], torch.float32),
            ("top_k", c["top_ks"][:n], torch.int32),
            ("min_p", c["min_ps"][:n], torch.float32),
        ]
        if enable_deterministic_sampling:
            fields.append(("sampling_seed", c["seeds"][:n], torch.int64))
        *flags, need_penalties = self._flags()
        if need_penalties:
            fields.append(("penalties", c["penalties"][:n], torch.float32))
        return fields, functools.partial(
            SamplingBatch.from_staged,
            with_seeds=enable_deterministic_sampling,
            with_penalties=need_penalties,
            flags=flags,
        )

    def stage_static(
        self,
        inputs: StaticInputs,
        extra: Optional[Mapping[str, Any]] = None,
        *,
        stream: Optional[torch.cuda.Stream] = None,
    ) -> None:
        """Fills a CUDA graph's static inputs for this step with ONE StaticInputs.stage (one copy on
        `stream`, the device's current stream by default; no waits): every field `inputs` declares
        from the state's columns (input_ids: the last tokens, seq_lens, req_pool_indices, the
        sampling parameters: static_step.BATCH_STATE_FIELDS) or from `extra` (the caller's per-step
        values that are not columns, e.g. positions, out_cache_loc: len(self) rows each). Rows past
        the batch take each field's fill; persistent fields (a block table) keep their rows and take
        the inputs' pending row writes. The sampling flags stay on the host (is_all_greedy...).
        KeyError naming every declared field that neither gives, ValueError for an `extra` name that
        the state stages itself or that `inputs` does not declare, and StaticInputs.stage's errors;
        nothing is staged then."""
        names = inputs.staged_names
        key = (self._version, names)
        if self._views is None or self._views[0] != key:
            self._views = (key,) + column_views(self._cols, self._size, names)
        _, views, needed = self._views
        inputs.stage(static_values(views, needed, extra), self._size, stream)

    # ----------------------------------------------------------------------------- storage

    def _reserve(self, rows: int) -> None:
        capacity = len(self._cols["seq_lens"])
        if rows <= capacity:
            return
        capacity = max(rows, 2 * capacity)
        for name, col in self._cols.items():
            grown = np.zeros((capacity,) + col.shape[1:], col.dtype)
            grown[: self._size] = col[: self._size]
            self._cols[name] = grown
        self._version += 1  # new arrays: views of the old ones (stage_static's) must not be reused


def _check_fits_column(field: str, value: int, column: str) -> None:
    """RuntimeError, as torch.tensor(value, dtype) and the list builders raise it, for an int the
    column's dtype cannot hold (numpy would raise a bare OverflowError after part of the row was
    written)."""
    info = np.iinfo(_COLUMNS[column][0])
    if not info.min <= value <= info.max:
        raise RuntimeError(
            f"BatchState.add: sampling_params.{field} = {value!r} cannot be converted to "
            f"torch.{info.dtype}: value cannot be converted to type {info.dtype} without overflow"
        )


def _int_array(ints: List[int]) -> npt.NDArray[Any]:
    """Python ints as int64, or as an object array where one is beyond int64 (for the range check to
    name it, not for numpy to wrap or refuse it)."""
    try:
        return np.array(ints, dtype=np.int64)
    except OverflowError:
        return np.array(ints, dtype=object)


def _checked_float(field: str, value: float) -> float:
    """value as a float, or OverflowError naming the field, as the list builders and torch.tensor
    raise it for an int beyond float's range (numpy would raise a bare one while writing the row)."""
    try:
        return float(value)
    except OverflowError as exc:
        raise OverflowError(
            f"BatchState.add: sampling_params.{field} = {value!r} cannot be converted to torch.float32: {exc}"
        ) from None


def _checked_int(where: str, field: str, value: object, lo: int, hi: int) -> int:
    if not is_integer_entry(value):
        raise TypeError(f"{where}: {field} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{where}: {field} must be in [{lo}, {hi}], got {value!r}")
    return int(value)

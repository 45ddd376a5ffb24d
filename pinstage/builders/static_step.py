"""A BatchState's per-step fields as a CUDA graph's static inputs (pinstage.StaticInputs).

BATCH_STATE_FIELDS declares them with the fills an engine pads a graph's batch bucket with, so that
a replay at a bucket larger than the batch reads harmless rows; batch_static_inputs() lays them out
(with the caller's own per-step fields, e.g. positions and out_cache_loc) and
BatchState.stage_static() fills them all with one copy.
"""

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy.typing as npt
import torch

from pinstage import Field, StaticInputs
from pinstage._api import Device

from .requests import TOP_K_ALL
from .sampling import DEFAULT_SAMPLING_SEED

# Rows past the batch: token 0 and request-pool row 0 (valid indices), seq_len 1 (SGLang's
# get_cuda_graph_seq_len_fill_value for most attention backends: a decode kernel always reads at
# least one slot), and sampling parameters that change nothing: temperature 1, top_p 1, top_k all,
# min_p 0, the default seed, no penalties (repetition 1).
BATCH_STATE_FIELDS: Dict[str, Field] = {
    "input_ids": Field(torch.int64),
    "seq_lens": Field(torch.int64, fill=1),
    "req_pool_indices": Field(torch.int64),
    "temperatures": Field(torch.float32, (1,), fill=1.0),  # [max_bs, 1], as SamplingBatch.temperatures
    "top_ps": Field(torch.float32, fill=1.0),
    "top_ks": Field(torch.int32, fill=TOP_K_ALL),
    "min_ps": Field(torch.float32, fill=0.0),
    "seeds": Field(torch.int64, fill=DEFAULT_SAMPLING_SEED),
    # One field per penalty (SamplingBatch.penalties' columns): a fill is one value per field, and
    # the neutral repetition penalty is 1, not 0.
    "frequency_penalties": Field(torch.float32, fill=0.0),
    "presence_penalties": Field(torch.float32, fill=0.0),
    "repetition_penalties": Field(torch.float32, fill=1.0),
}
# Field -> (BatchState column, index within its row or None for the whole row).
_SOURCES: Dict[str, Tuple[str, Optional[int]]] = {
    "input_ids": ("last_token_ids", None),
    "seq_lens": ("seq_lens", None),
    "req_pool_indices": ("req_pool_indices", None),
    "temperatures": ("temperatures", None),
    "top_ps": ("top_ps", None),
    "top_ks": ("top_ks", None),
    "min_ps": ("min_ps", None),
    "seeds": ("seeds", None),
    "frequency_penalties": ("penalties", 0),
    "presence_penalties": ("penalties", 1),
    "repetition_penalties": ("penalties", 2),
}
PENALTY_FIELDS = tuple(name for name, (column, _) in _SOURCES.items() if column == "penalties")


def batch_static_inputs(
    max_bs: int,
    extra: Optional[Mapping[str, Field]] = None,
    *,
    seeds: bool = False,
    penalties: bool = False,
    device: Device = None,
) -> StaticInputs:
    """A StaticInputs of BATCH_STATE_FIELDS (seeds only with seeds=True, the three penalty fields
    only with penalties=True) followed by the caller's `extra` fields (name -> Field), for batches
    of up to max_bs requests. ValueError when `extra` declares a name the batch state stages."""
    extra = dict(_checked_extra("batch_static_inputs", extra))
    skipped = (() if seeds else ("seeds",)) + (() if penalties else PENALTY_FIELDS)
    fields = {name: f for name, f in BATCH_STATE_FIELDS.items() if name not in skipped}
    fields.update(extra)
    return StaticInputs(fields, max_bs, device)


def column_views(
    columns: Mapping[str, npt.NDArray[Any]], n: int, names: Tuple[str, ...]
) -> Tuple[Dict[str, npt.NDArray[Any]], Tuple[str, ...]]:
    """The batch state's views over its n rows for the fields of `names` it gives, and the names it
    does not give (they must come in extra). Views, not copies: they stay right while the columns
    are written in place, so BatchState makes them again only when its membership changes."""
    views: Dict[str, npt.NDArray[Any]] = {}
    for name in names:
        source = _SOURCES.get(name)
        if source is not None:
            column, part = source
            views[name] = columns[column][:n] if part is None else columns[column][:n, part]
    return views, tuple(name for name in names if name not in views)


def static_values(
    views: Mapping[str, npt.NDArray[Any]], needed: Tuple[str, ...], extra: Optional[Mapping[str, Any]]
) -> Dict[str, Any]:
    """StaticInputs.stage's values: column_views' `views` and `extra`, which must give every name in
    `needed`. KeyError naming every field neither gives."""
    extra = _checked_extra("BatchState.stage_static", extra)  # an undeclared name: stage() names it
    missing = [name for name in needed if name not in extra]
    if missing:
        raise KeyError(
            f"BatchState.stage_static: no values for {', '.join(map(repr, missing))}: the batch state gives "
            f"{', '.join(_SOURCES)}; pass the others in extra"
        )
    return {**views, **extra}


def _checked_extra(where: str, extra: Optional[Mapping[str, Any]]) -> Mapping[str, Any]:
    """`extra` (None: empty) if it is a mapping that names no field the batch state stages itself:
    the state's own value and the caller's could disagree, and neither should win silently."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise TypeError(f"{where}: extra must be a dict of field name -> value, got {type(extra).__name__}")
    clash = [name for name in extra if name in _SOURCES]
    if clash:
        raise ValueError(f"{where}: extra names {', '.join(map(repr, clash))}, which the batch state stages itself")
    return extra

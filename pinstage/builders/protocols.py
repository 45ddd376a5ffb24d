"""What the builders read of an engine's objects, as typing.Protocols: any object with these fields
is accepted, SGLang's own Req and SamplingParams included (the fields are named as SGLang 0.5.23
names them). Members are read-only properties so that plain attributes, properties and slots all
match them.

SGLang 0.5.23 keeps a request's req_to_token row at `req.kv.req_pool_idx` (ReqKvInfo), earlier
versions and pinstage's Request at `req.req_pool_idx`: a typing.Protocol cannot say "one of two
fields", so the requests that carry a row are a Union of the two shapes.
"""

from typing import Optional, Protocol, Sequence, Union


class SamplingFields(Protocol):
    """One request's sampling settings: SGLang's SamplingParams fields of the same names (after its
    __post_init__: top_k == TOP_K_ALL for all tokens, greedy as temperature 1 with top_k 1)."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def min_p(self) -> float: ...
    @property
    def sampling_seed(self) -> Optional[int]: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...


class TokenHistory(Protocol):
    """A request's prompt and the tokens generated so far (SGLang's Req: a list and an array("q"))."""

    @property
    def origin_input_ids(self) -> Sequence[int]: ...
    @property
    def output_ids(self) -> Sequence[int]: ...


class PoolRow(Protocol):
    """Holds a request's row in req_to_token (SGLang 0.5.23's ReqKvInfo; None while it holds none,
    which the builders refuse)."""

    @property
    def req_pool_idx(self) -> Optional[int]: ...


class RowRequest(TokenHistory, PoolRow, Protocol):
    """A request with its row on itself: `req.req_pool_idx` (pinstage's Request, SGLang before 0.5.23)."""


class KvRequest(TokenHistory, Protocol):
    """A request with its row in its KV record: `req.kv.req_pool_idx` (SGLang 0.5.23's Req)."""

    @property
    def kv(self) -> PoolRow: ...


# What build_decode_inputs reads.
DecodeRequest = Union[RowRequest, KvRequest]


class SampledRowRequest(RowRequest, Protocol):
    @property
    def sampling_params(self) -> SamplingFields: ...


class SampledKvRequest(KvRequest, Protocol):
    @property
    def sampling_params(self) -> SamplingFields: ...


# What BatchState.add reads.
BatchRequest = Union[SampledRowRequest, SampledKvRequest]

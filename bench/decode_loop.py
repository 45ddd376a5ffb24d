#!/usr/bin/env python3
"""An overlap scheduler in miniature: continuous batching over a small decoder, each backend's way of
getting the per-step host data onto the GPU, side by side in one process with one workload.

Per decode step the host prepares step k+1's inputs while the GPU runs step k. The decode step
(forward, logits, penalties, temperature, top-k/top-p/min-p, sampling) is one CUDA graph per
batch-size bucket, padded with a calibrated busy-wait kernel so that it takes --forward-ms; its
static inputs are seq_lens, req_pool_indices, out_cache_loc and seven sampling parameters per
request (laid out in one allocation by pinstage.StaticInputs), and the input ids, which
stay on the device (the tokens sampled the step before, one device-to-device copy for every backend).
The sampled tokens come back to the host one step late. Requests arrive in bursts and are
prefilled eagerly (write_cache_indices from a shared cached prefix, logits indices for the input
logprobs some ask for), decode with mixed greedy / sampled settings and penalties, and finish at
different lengths.

Every backend writes the same static inputs before the same replay; they differ in where the host
values come from and how they reach the device (the table's legend says which pays what):
  blocking         request objects -> torch.tensor -> blocking copy, one per field
  pinned           request objects -> pinned tensor -> non_blocking copy, one per field (SGLang's lists)
  pinstage_list    request objects -> pinstage.stage_into, one per field
  sglang_state     numpy state -> a pinned tensor per column -> non_blocking copy (SGLang 0.5.23's numpy path)
  vllm_buffer      numpy state -> persistent pinned buffer per field -> copy_to_gpu(n) (vLLM's CpuGpuBuffer;
                   it rewrites pinned memory an earlier copy may still read: timing only)
  pinstage_state   numpy state -> pinstage.stage_into, one per field
  packed_buffer    numpy state -> one persistent pinned buffer laid out like the static inputs -> one
                   copy (the unguarded single copy; it races on reuse like vllm_buffer: timing only)
  pinstage_static  numpy state -> BatchState.stage_static: every field in one StaticInputs.stage, one copy
  ideal_same_host  the state backends' host work (bookkeeping, the decode values, the prefill's lists),
                   then one device-to-device copy of inputs recorded on the device: its ratio to a state
                   backend is staging alone
  copy_floor       ideal_same_host, but each staging pinstage_static makes is one host-to-device copy
                   of as many bytes from pinned memory filled beforehand (a decode step's inputs restored
                   that way, not from the device; a prefill's bytes and the keep indices into memory
                   nothing reads): what the copies cost by themselves, which no engine that stages from
                   the host avoids. pinstage_static over it is the staging's host work, but that the
                   ideals' prefill writes its cache rows by an index_put_ where stage_prefill's one
                   launch copies and writes them
  ideal            no host preparation at all: recorded device inputs, one device-to-device copy
"numpy state" is BatchState's columns (written when a request joins, compacted when requests leave);
"request objects" is a Python gather over the running requests each step. Prefill inputs and the
tokens' keep indices go through the list builders of the backend's kind (blocking, pinned or
pinstage: the pinstage backends stage the prompt lists, the logits indices and the sampling batch in
one stage_prefill, which writes the cache rows too); the ideals replay them. The state backends read
the prefill's sampling values from the joining requests' own BatchState (written as they join,
merged into the running one after the prefill, as SGLang merges a prefill batch), the request
backends gather them from the objects. The
state backends' membership bookkeeping (BatchState.add as requests join, filter as they leave) is
untimed for all of them, the same-host ideal included; the request backends have none, and pay
their gather in the timed prep. Rows
past the batch must hold the padding row's address: the per-field backends fill the three address
fields there with device fills when the batch shrinks, StaticInputs writes every field's fill in its
one copy. Each backend runs --repeats times, in an
order rotated between rounds; medians and min-max are reported (a ratio of two backends: the median
of the rounds' ratios, each round's pair run close together), and the gains of one step at a time
(numpy state over request objects, the ring over pinned tensors, one copy over one per field, and
the ring's cost against the unguarded single copy). Every backend must generate the same tokens
(asserted; the unsafe baselines' differences are counted, as their races may show).
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Dict, List, NamedTuple, Optional

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _baseline_builders as baseline  # noqa: E402
import _report  # noqa: E402
import _timing  # noqa: E402
from _baselines import CpuGpuBuffer, PackedPinnedBuffer, pinned_host, stage  # noqa: E402
from _decode_model import (  # noqa: E402
    DecodeGraphs,
    SamplerInputs,
    Snapshot,
    TinyDecoder,
    sample,
)
from microbench import GpuBusy  # noqa: E402

import pinstage  # noqa: E402
from pinstage.builders import (  # noqa: E402
    BatchState,
    CacheRows,
    Request,
    SamplingParams,
    sampling_fields,
    stage_prefill,
)


class Backend(NamedTuple):
    source: Optional[str]  # "requests": lists gathered from request objects; "state": BatchState's columns
    copy: str  # how the values reach the static inputs
    builders: str  # prefill builders and keep indices: "blocking", "pinned", "pinstage", or "replay" (recorded)
    title: str


BACKENDS = {
    "blocking": Backend("requests", "blocking", "blocking", "requests -> blocking torch.tensor copy per field"),
    "pinned": Backend("requests", "pinned", "pinned", "requests -> pinned tensor + non_blocking copy per field"),
    "pinstage_list": Backend("requests", "stage_into", "pinstage", "requests -> pinstage.stage_into per field"),
    "sglang_state": Backend("state", "pinned", "pinned", "numpy state -> pinned tensor per column (SGLang 0.5.23)"),
    "vllm_buffer": Backend(
        "state", "vllm_buffer", "pinned", "numpy state -> vLLM CpuGpuBuffer.copy_to_gpu per field (unsafe on reuse)"
    ),
    "pinstage_state": Backend("state", "stage_into", "pinstage", "numpy state -> pinstage.stage_into per field"),
    "packed_buffer": Backend(
        "state",
        "packed_buffer",
        "pinned",
        "numpy state -> one pinned buffer like the inputs, one copy (unsafe on reuse)",
    ),
    "pinstage_static": Backend(
        "state", "static_inputs", "pinstage", "numpy state -> BatchState.stage_static (StaticInputs): one copy"
    ),
    "ideal_same_host": Backend("state", "snapshot", "replay", "ideal, same host work: state bookkeeping, no staging"),
    "copy_floor": Backend(
        "state", "floor_copies", "replay", "ideal, same host work, and each staging's bytes copied from filled memory"
    ),
    "ideal": Backend(None, "snapshot", "replay", "ideal: no host preparation, inputs already on the device"),
}
# What each step buys, as a ratio of tokens/s between two backends that differ in that step alone.
GAINS = {
    "layout gain": ("sglang_state", "pinned"),  # numpy state instead of request objects, same copies
    "ring gain": ("pinstage_state", "sglang_state"),  # pinstage instead of a pinned tensor per field, same state
    "one-copy gain": ("pinstage_static", "pinstage_state"),  # one copy for every field instead of one each
    "ring's cost": ("pinstage_static", "packed_buffer"),  # the same one copy, guarded by the ring or not
    "copies' cost": ("copy_floor", "ideal_same_host"),  # the staging copies alone, nothing converted
    "beyond copies": ("pinstage_static", "copy_floor"),  # pinstage's host work around those copies
}
RECORDER = "pinstage_state"  # the untimed run whose device inputs the ideals replay
UNSAFE = ("vllm_buffer", "packed_buffer")  # baselines that rewrite pinned memory a copy may still read
PENDING = -1  # an output token sampled on the device, not read back yet

# Checks (same run, H200).
STATIC_OF_SAME_HOST = 0.99  # pinstage_static / ideal_same_host, 0.2 and 1 ms, every batch size
STATIC_OF_PACKED = 0.99  # pinstage_static / packed_buffer (the ring's cost), every configuration
STATIC_OF_IDEAL_1MS = 0.97  # pinstage_static / ideal, 1 ms
STATE_OF_IDEAL_1MS = 0.97  # pinstage_state / ideal, 1 ms
STAGE_OVER_BLOCKING_SMALL = 1.25  # pinstage_list and pinstage_state / blocking, bs 1-8, 0.2 ms


@dataclasses.dataclass
class Config:
    batch_size: int
    forward_ms: float
    steps: int = 200
    warmup_steps: int = 20
    vocab: int = 4096
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 2
    max_ctx: int = 256
    prefix_len: int = 16  # the shared cached prefix (a system prompt)
    admit_every: int = 4  # new requests join in bursts: the batch shrinks, then grows
    seed: int = 1234


# ------------------------------------------------------------------------------------------ workload


@dataclasses.dataclass
class Spec:
    """One request of the workload, the same for every backend."""

    rid: int
    prompt: List[int]
    max_new_tokens: int
    params: SamplingParams
    logprob_start: int  # == len(extend) for no input logprobs
    use_prefix: bool


def make_workload(cfg, count):
    rng = np.random.default_rng(cfg.seed)
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.8, top_p=0.9),
        dict(temperature=1.0, top_k=40),
        dict(temperature=0.7, min_p=0.05, frequency_penalty=0.5),
        dict(temperature=1.2, top_k=20, top_p=0.8, repetition_penalty=1.2, presence_penalty=0.3),
    ]
    specs = []
    for rid in range(count):
        use_prefix = bool(rng.random() < 0.5)
        extend = int(rng.integers(8, 48))
        prompt = rng.integers(1, cfg.vocab, extend).tolist()
        longest = cfg.max_ctx - cfg.prefix_len - extend - 1
        max_new = int(rng.integers(max(2, longest // 4), longest))
        start = extend if rng.random() < 0.6 else int(rng.integers(0, extend))
        specs.append(Spec(rid, prompt, max_new, SamplingParams(**settings[rid % len(settings)]), start, use_prefix))
    return specs


# ---------------------------------------------------------------------------------------- the loop


class Running:
    """A request in the batch: its spec, its Request (what the builders read) and its progress."""

    def __init__(self, spec, row, prefix_len):
        prompt = list(range(1, prefix_len + 1)) + list(spec.prompt)  # the cached prefix is the prompt's head
        self.spec, self.prefix_len = spec, prefix_len
        self.request = Request(prompt, [], req_pool_idx=row, sampling_params=spec.params)
        self.generated = 0  # tokens sampled on the device so far
        self.prefix_slots = None  # its cached prefix's KV slots (a device view), set when admitted

    @property
    def seq_len(self):
        return len(self.request.origin_input_ids) + self.generated


class PrefillInputs(NamedTuple):
    ids: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_rows: torch.Tensor
    seq_lens: torch.Tensor
    indices: object
    batch: object
    cache_rows: tuple = None  # (rows, prefix slot tensors, extend_lens, out_cache_loc): write_cache_indices's input
    cache_write: tuple = None  # the ideal's ((row, column) device indices, values) for those writes


def staged_bytes(item):
    """The bytes pinstage staged for one recorded staging other than a decode step's inputs: a
    prefill's tensors, or the keep indices."""
    if isinstance(item, PrefillInputs):
        item = item._replace(cache_rows=None, cache_write=None)  # the ideal's own, not staged
    if isinstance(item, torch.Tensor):
        return item.nbytes
    if dataclasses.is_dataclass(item):  # a SamplingBatch
        item = [getattr(item, f.name) for f in dataclasses.fields(item)]
    if isinstance(item, (tuple, list)):
        return sum(staged_bytes(v) for v in item)
    return 0  # a flag, or a field left out (None)


class FloorCopies:
    """copy_floor's copies: for each replayed staging, the views of one host-to-device copy, made
    before the timed steps. A decode step's recorded inputs (a Snapshot) are restored from pinned
    memory into the graph's inputs, in place of the ideals' device-to-device restore; any other
    staging copies as many bytes as it staged from pinned memory into device memory nothing reads.
    Nothing is converted and nothing guards the host memory, which is never rewritten."""

    def __init__(self, replay, device):
        pin = device.type == "cuda"
        sizes = [None if isinstance(item, Snapshot) else staged_bytes(item) for item in replay]
        scratch = max([n for n in sizes if n is not None], default=0)
        host = torch.zeros(scratch, dtype=torch.uint8, pin_memory=pin)
        dev = torch.empty(scratch, dtype=torch.uint8, device=device)
        self.pairs = []  # (device destination, host source), one per replayed staging
        for item, n in zip(replay, sizes):
            if n is None:
                saved = item.saved.cpu()
                self.pairs.append((item.whole, saved.pin_memory() if pin else saved))
            else:
                self.pairs.append((dev[:n], host[:n]))
        self._next = iter(self.pairs)

    def copy_next(self):
        dst, src = next(self._next)
        dst.copy_(src, non_blocking=True)


def for_the_ideal(recorded):
    """A run's recorded inputs with each prefill's cache write turned into device index tensors
    (made before the ideals' timed runs), so that the ideals do that write without host work."""
    out = []
    for item in recorded:
        if isinstance(item, PrefillInputs):
            rows, prefixes, extend_lens, loc = item.cache_rows
            values, row_ids, cols, offset = [], [], [], 0
            for row, prefix, n in zip(rows, prefixes, extend_lens):
                values += [prefix, loc[offset : offset + n]]
                row_ids += [row] * (len(prefix) + n)
                cols += range(len(prefix) + n)
                offset += n
            index = (torch.tensor(row_ids, device=loc.device), torch.tensor(cols, device=loc.device))
            item = item._replace(cache_rows=None, cache_write=(index, torch.cat(values).to(torch.int32)))
        out.append(item)
    return out


class Loop:
    """One backend's run over the workload. Each step's host preparation is timed; with `record`
    the device inputs are kept (a snapshot of the static inputs per decode step), and with `replay`
    they are used instead of staging any (the ideals)."""

    def __init__(self, backend, cfg, model, graphs, specs, record=None, replay=None):
        self.backend, self.kind, self.cfg, self.model, self.graphs = backend, BACKENDS[backend], cfg, model, graphs
        self.dev = model.device
        self.cuda = self.dev.type == "cuda"
        self.pending_specs = list(specs)
        self.running: List[Running] = []
        self.state = BatchState(capacity=2 * cfg.batch_size) if self.kind.source == "state" else None
        self.vllm = (
            {name: CpuGpuBuffer(graphs.inputs[name]) for name in graphs.fields}
            if self.kind.copy == "vllm_buffer"
            else None
        )
        fills = {name: fill for name, (_, fill) in graphs.fields.items()}
        self.packed = PackedPinnedBuffer(graphs.inputs, fills) if self.kind.copy == "packed_buffer" else None
        self.free_rows = list(range(model.rows))
        self.tokens: Dict[int, List[int]] = {}
        self.next_ids = torch.zeros(0, dtype=torch.int64, device=self.dev)
        self.inflight = []  # (read-back handle, request ids in batch order)
        self.prep_s, self.step_prep, self.step_events = [], 0.0, []  # prep_s: (seconds, prefill ran) per step
        self.record, self.replay = record, None if replay is None else iter(replay)
        self.floor = FloorCopies(replay, self.dev) if self.kind.copy == "floor_copies" else None
        self.filling = True  # until the batch first reaches its size, requests are admitted every step
        self.filled = 0  # rows of the static inputs holding live addresses (the per-field copies pad the rest)
        self.step_index = 0
        graphs.reset_inputs()
        model.reset()
        self.prefix_slots = self._make_prefix()

    def prepared(self, build, host_work=None):
        """build()'s device inputs, or the recorded ones when replaying (after `host_work()`, the
        host's own part, for ideal_same_host); timed as host preparation."""
        t0 = time.perf_counter()
        if self.replay is not None:
            if host_work is not None and self.kind.source is not None:
                host_work()
            value = next(self.replay)
            if self.floor is not None:
                self.floor.copy_next()
        else:
            value = build()
            if self.record is not None:
                self.record.append(value)
        self.step_prep += time.perf_counter() - t0
        return value

    def stage(self, items):
        return stage(items, self.kind.builders, self.dev)

    def _make_prefix(self):
        """The shared cached prefix (a system prompt): its K/V computed once into its own row's slots."""
        cfg, m = self.cfg, self.model
        ids = torch.arange(1, cfg.prefix_len + 1, device=self.dev)
        positions = torch.arange(cfg.prefix_len, device=self.dev)
        slots = m.prefix_row * cfg.max_ctx + positions
        m.req_to_token[m.prefix_row, : cfg.prefix_len] = slots.int()
        m.forward(ids, torch.full_like(ids, m.prefix_row), positions, slots)
        return slots

    # ----- prefill

    def admit(self):
        cfg = self.cfg
        if not self.filling and self.step_index % cfg.admit_every:
            return []
        room, budget, new = cfg.batch_size - len(self.running), 1024, []
        while self.pending_specs and len(new) < room and budget >= len(self.pending_specs[0].prompt):
            spec = self.pending_specs.pop(0)
            budget -= len(spec.prompt)
            r = Running(spec, self.free_rows.pop(0), cfg.prefix_len if spec.use_prefix else 0)
            # Its cached prefix's slots, as an engine's radix-cache match hands a request its prefix
            # indices when it is scheduled: a device view made once, not per builder call.
            r.prefix_slots = self.prefix_slots[: r.prefix_len]
            new.append(r)
        return new

    def prefill_values(self, new):
        """The prefill's per-token and per-request lists: host bookkeeping, which ideal_same_host
        does too."""
        max_ctx = self.cfg.max_ctx
        rows = [r.request.req_pool_idx for r in new]
        prefix_lens = [r.prefix_len for r in new]
        extend_lens = [len(r.spec.prompt) for r in new]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        starts = [r.spec.logprob_start for r in new]
        token_rows = [row for row, e in zip(rows, extend_lens) for _ in range(e)]
        positions = [p + i for p, e in zip(prefix_lens, extend_lens) for i in range(e)]
        ids = [t for r in new for t in r.spec.prompt]
        locations = [row * max_ctx + pos for row, pos in zip(token_rows, positions)]
        return rows, prefix_lens, extend_lens, seq_lens, starts, token_rows, positions, ids, locations

    def prefill_inputs(self, new, joining):
        m = self.model
        b = self.kind.builders
        rows, prefix_lens, extend_lens, seq_lens, starts, token_rows, positions, ids, locations = self.prefill_values(
            new
        )
        lists = [(v, torch.int64) for v in (ids, token_rows, positions, locations, rows, seq_lens)]
        # The state backends read the sampling values from the joining requests' own BatchState
        # (written once, when they joined); the others gather them from the request objects.
        if joining is not None:
            fields, sampling_batch = joining.sampling_fields()
        else:
            fields, sampling_batch = sampling_fields([r.spec.params for r in new])
        prefixes = [r.prefix_slots for r in new]
        if b == "pinstage":
            # Everything the prefill reads in one call: one ring region, one copy, and the cache rows
            # written behind it from the staged out_cache_loc (item 3).
            cache = CacheRows(m.req_to_token, rows, prefixes, prefix_lens, seq_lens, 3)
            staged, indices = stage_prefill(
                lists + [(v, dtype) for _, v, dtype in fields], extend_lens, starts, cache, device=self.dev
            )
            batch = sampling_batch(staged[6:])
        else:
            staged = self.stage(lists)
            indices = baseline.build_logprob_indices(extend_lens, starts, b, self.dev)
            batch = baseline.stage_sampling_fields(fields, sampling_batch, b, self.dev)
            cache_args = (m.req_to_token, rows, prefixes, prefix_lens, seq_lens, extend_lens, staged[3])
            baseline.write_cache_indices(*cache_args, b)
        ids, rows_d, pos_d, loc_d, req_rows, seq_d = staged[:6]
        return PrefillInputs(
            ids, rows_d, pos_d, loc_d, req_rows, seq_d, indices, batch, cache_rows=(rows, prefixes, extend_lens, loc_d)
        )

    def prefill(self, staged):
        """Extends the new requests' prompts after their cached prefix and samples each one's first
        token (with the input logprobs some of them asked for), eagerly. Returns the first tokens."""
        m, s = self.model, staged
        if s.cache_write is not None:  # the ideals: write_cache_indices's writes, from device tensors
            m.req_to_token.index_put_(*s.cache_write)
        kept = m.logits(m.forward(s.ids, s.rows, s.positions, s.out_cache_loc)[s.indices.pruned_row_indices])
        kept[s.indices.input_logprob_indices].log_softmax(-1)  # the input logprobs an engine would return
        return sample(kept[s.indices.sample_indices], SamplerInputs.of_batch(s.batch), s.req_rows, s.seq_lens, m.counts)

    @staticmethod
    def joining_state(new):
        joining = BatchState(capacity=len(new))
        for r in new:
            joining.add(r.request)
        return joining

    # ----- decode

    def decode_values(self):
        """This step's values of the static inputs' fields, in batch order: numpy column slices of
        the batch state, or Python lists gathered from the request objects."""
        max_ctx = self.cfg.max_ctx
        if self.state is not None:
            st = self.state
            seq, rows, penalties = st.column("seq_lens"), st.column("req_pool_indices"), st.column("penalties")
            return {
                "seq_lens": seq,
                "req_pool_indices": rows,
                "out_cache_loc": self.state_out_cache_loc(),
                "temperatures": st.column("temperatures"),
                "top_ps": st.column("top_ps"),
                "top_ks": st.column("top_ks"),
                "min_ps": st.column("min_ps"),
                "frequency_penalties": penalties[:, 0],
                "presence_penalties": penalties[:, 1],
                "repetition_penalties": penalties[:, 2],
            }
        params = [r.spec.params for r in self.running]
        rows = [r.request.req_pool_idx for r in self.running]
        seq = [r.seq_len for r in self.running]
        return {
            "seq_lens": seq,
            "req_pool_indices": rows,
            "out_cache_loc": [w * max_ctx + s - 1 for w, s in zip(rows, seq)],
            "temperatures": [p.temperature for p in params],
            "top_ps": [p.top_p for p in params],
            "top_ks": [p.top_k for p in params],
            "min_ps": [p.min_p for p in params],
            "frequency_penalties": [p.frequency_penalty for p in params],
            "presence_penalties": [p.presence_penalty for p in params],
            "repetition_penalties": [p.repetition_penalty for p in params],
        }

    def state_out_cache_loc(self):
        """Each request's new KV slot (its row's slot at its last position): the one decode input
        that is not a column of the batch state."""
        return self.state.column("req_pool_indices") * self.cfg.max_ctx + self.state.column("seq_lens") - 1

    def write_inputs(self, bs):
        """Writes this step's values into the graph's static inputs, the backend's way. Returns a
        snapshot of them when recording (for the ideals), else None."""
        if self.kind.copy == "static_inputs":
            # BatchState's own one-call staging: its columns and out_cache_loc, rows bs.. the fills.
            self.state.stage_static(self.graphs.inputs, {"out_cache_loc": self.state_out_cache_loc()})
        elif self.kind.copy == "packed_buffer":
            self.packed.write(self.decode_values(), bs)
        else:
            self.write_per_field(self.decode_values(), bs)
        return Snapshot(self.graphs.inputs) if self.record is not None else None

    def write_per_field(self, values, bs):
        """One host-to-device copy per field; the address fields of rows the batch no longer fills
        get the padding row's address first."""
        if self.filled > bs:
            self.graphs.pad(bs, self.filled)
        self.filled = bs
        for name, v in values.items():
            dst = self.graphs.inputs[name][:bs]
            if self.kind.copy == "stage_into":
                pinstage.stage_into(v, dst)
            elif self.kind.copy == "vllm_buffer":
                self.vllm[name].write(v)
            elif self.kind.copy == "pinned":
                dst.copy_(pinned_host(v, dst.dtype, pin=self.cuda), non_blocking=True)
            else:  # blocking: from pageable memory, the host waits for the copy
                dst.copy_(torch.tensor(v, dtype=dst.dtype))

    def decode(self, snapshot, bs):
        """The graph's replay on the static inputs (restored from `snapshot` by the ideals, but
        copy_floor, whose staging restored them from the host) and the device's next input ids.
        Returns the sampled tokens (device)."""
        if self.replay is not None and self.floor is None:
            snapshot.restore()
        self.graphs.input_ids[:bs].copy_(self.next_ids, non_blocking=True)
        return self.graphs.run(bs)

    # ----- bookkeeping

    def fetch(self, tokens, rids):
        if self.kind.builders in ("pinstage", "replay"):
            handle = pinstage.fetch_to_host(tokens)
        else:
            handle = _NonBlockingFetch(tokens)
        self.inflight.append((handle, rids))

    def read_back(self, wait_all=False):
        """Records the tokens of earlier steps: those whose copies are done, and all but the newest
        step's (one step late), or everything with wait_all."""
        while self.inflight and (wait_all or len(self.inflight) > 1 or self.inflight[0][0].ready()):
            handle, rids = self.inflight.pop(0)
            for rid, token in zip(rids, handle.tolist()):
                self.tokens.setdefault(rid, []).append(token)
            handle.release()

    def step(self):
        """One scheduler step: admit, prepare every input on the host, launch the prefill and the
        decode on the device, retire the finished requests. The CUDA events around the launches
        time the GPU's starvation: the gap from one step's end to the next step's launches is where
        the GPU waited for the host."""
        self.step_prep = 0.0
        new = self.admit()
        # The joining requests' fields, written once into their own batch state (a prefill batch,
        # merged into the running one after it): membership bookkeeping, untimed as retire's is.
        joining = self.joining_state(new) if new and self.state is not None else None
        prefill_staged = (
            self.prepared(lambda: self.prefill_inputs(new, joining), lambda: self.prefill_values(new)) if new else None
        )
        for r in new:
            r.generated = 1
            r.request.output_ids.append(PENDING)  # its first token, sampled by the prefill
            self.running.append(r)
        if joining is not None:
            joining.append_tokens(np.full(len(new), PENDING, dtype=np.int64))
            self.state.merge(joining)
        if len(self.running) >= self.cfg.batch_size or not self.pending_specs:
            self.filling = False
        bs = len(self.running)
        snapshot = self.prepared(lambda: self.write_inputs(bs), self.decode_values) if bs else None
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
        if new:
            first = self.prefill(prefill_staged)
            self.fetch(first, [r.spec.rid for r in new])
            self.next_ids = torch.cat([self.next_ids, first])
        if bs:
            tokens = self.decode(snapshot, bs)
            self.fetch(tokens, [r.spec.rid for r in self.running])
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.step_events.append((begin, end))
        if bs:
            self.retire(tokens)
        self.prep_s.append((self.step_prep, bool(new)))
        self.read_back()
        self.step_index += 1

    def retire(self, tokens):
        """Every running request got a token; those at their length leave the batch, and the device
        tokens follow the batch (the kept rows' tokens feed the next step)."""
        for r in self.running:
            r.generated += 1
            r.request.output_ids.append(PENDING)
        if self.state is not None:
            self.state.append_tokens(np.full(len(self.running), PENDING, dtype=np.int64))
        keep = [i for i, r in enumerate(self.running) if r.generated < r.spec.max_new_tokens]
        if len(keep) < len(self.running):
            for r in self.running:
                if r.generated >= r.spec.max_new_tokens:
                    self.free_rows.append(r.request.req_pool_idx)
                    self.model.counts[r.request.req_pool_idx].zero_()
            self.running = [self.running[i] for i in keep]
            if self.state is not None:
                self.state.filter(keep)
            (keep_d,) = self.prepared(lambda: self.stage([(keep, torch.int64)]))
            tokens = tokens[keep_d]
        self.next_ids = tokens

    def done(self):
        return not self.running and not self.pending_specs


class _NonBlockingFetch:
    """The usual read-back: .to("cpu", non_blocking=True) and an event, synchronised when read."""

    def __init__(self, tokens):
        self.host = tokens.to("cpu", non_blocking=True)
        self.event = torch.cuda.Event() if tokens.is_cuda else None
        if self.event is not None:
            self.event.record()

    def ready(self):
        return self.event is None or self.event.query()

    def tolist(self):
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()

    def release(self):
        pass


# ------------------------------------------------------------------------------------------ running


def run_backend(backend, cfg, model, graphs, specs, record=None, replay=None):
    """Warms up (until the batch first fills, and warmup_steps more), then times `cfg.steps` steps."""
    loop = Loop(backend, cfg, model, graphs, specs, record=record, replay=replay)
    while loop.filling and not loop.done():
        loop.step()
    for _ in range(cfg.warmup_steps):
        loop.step()
    if loop.cuda:
        torch.cuda.synchronize()
    loop.prep_s.clear()
    loop.step_events.clear()

    def produced():
        return sum(len(t) for t in loop.tokens.values()) + sum(len(rids) for _, rids in loop.inflight)

    before = produced()
    t0 = time.perf_counter()
    steps = 0
    while steps < cfg.steps and not loop.done():
        loop.step()
        steps += 1
    if loop.cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    generated = produced() - before
    loop.read_back(wait_all=True)
    return loop.tokens, {
        "steps": steps,
        "tokens_per_s": generated / wall,
        "steps_per_s": steps / wall,
        "prep_us_per_step": _median_us([t for t, _ in loop.prep_s]) or 0.0,
        # The two kinds of step apart: a prefill step also builds the prefill's inputs.
        "decode_prep_us": _median_us([t for t, prefill in loop.prep_s if not prefill]),
        "prefill_prep_us": _median_us([t for t, prefill in loop.prep_s if prefill]),
        "gpu_idle_fraction": gpu_idle_fraction(loop.step_events) if loop.cuda else None,
    }


def _median_us(seconds):
    return 1e6 * float(np.median(seconds)) if seconds else None


def gpu_idle_fraction(events):
    """Share of the span from the first step's launches to the last step's end in which the GPU sat
    between one step's end and the next step's launches: waiting for the host."""
    if len(events) < 2:
        return None
    gaps = sum(max(0.0, events[i][1].elapsed_time(events[i + 1][0])) for i in range(len(events) - 1))
    span = events[0][0].elapsed_time(events[-1][1])
    return gaps / span if span > 0 else None


def rotated(names, round_index, rounds):
    """The backends' order in one round: each round starts further along, so that no backend always
    runs first (or right after the same neighbour) while the machine warms up or drifts."""
    shift = (round_index * len(names)) // max(1, rounds)
    return names[shift:] + names[:shift]


def run_config(cfg, dev, cycles_per_us, repeats=3, backends=None):
    """Every backend on one (batch size, forward time), `repeats` rounds in rotated order, after one
    untimed run that records the device inputs the ideals replay. Asserts equal tokens."""
    specs = make_workload(cfg, 2 * cfg.batch_size + (cfg.warmup_steps + cfg.steps) * max(1, cfg.batch_size // 8) + 8)
    model = TinyDecoder(cfg, dev)
    graphs = DecodeGraphs(model, cfg.forward_ms, cycles_per_us)
    recorded = []
    reference, _ = run_backend(RECORDER, cfg, model, graphs, specs, record=recorded)
    replay = for_the_ideal(recorded)
    names = list(backends or BACKENDS)
    runs = {name: [] for name in names}
    for round_index in range(repeats):
        for name in rotated(names, round_index, repeats):
            tokens, metrics = run_backend(
                name, cfg, model, graphs, specs, replay=replay if BACKENDS[name].builders == "replay" else None
            )
            metrics["requests_with_other_tokens"] = _other_tokens(name, tokens, reference)
            runs[name].append(metrics)
            _progress(cfg, name, metrics)
    return summarize(runs)


def _other_tokens(backend, tokens, reference):
    """How many requests got other tokens than the recorded run; any is an error but for the
    unsafe baselines, whose pinned buffers an in-flight copy may still read."""
    bad = sorted(rid for rid in set(reference) | set(tokens) if reference.get(rid) != tokens.get(rid))
    assert not bad or backend in UNSAFE, (
        "%s generated other tokens than %s for %d request(s), e.g. request %d: %s vs %s"
        % (backend, RECORDER, len(bad), bad[0], tokens.get(bad[0]), reference.get(bad[0]))
    )
    return len(bad)


def summarize(runs):
    """backend -> median and min-max of each metric over the rounds, and each round's fraction of the
    ideal's tokens/s in the same round (rounds pair up, so a drift between rounds cancels)."""
    out = {}
    for name, metrics in runs.items():
        summary = {"runs": metrics}
        for key in (
            "tokens_per_s",
            "prep_us_per_step",
            "decode_prep_us",
            "prefill_prep_us",
            "gpu_idle_fraction",
            "requests_with_other_tokens",
        ):
            values = [m[key] for m in metrics if m[key] is not None]
            summary[key], summary[key + "_range"] = _report.median_range(values)
        fractions = round_ratios(metrics, runs.get("ideal", []))
        summary["of_ideal"], summary["of_ideal_range"] = _report.median_range(fractions)
        out[name] = summary
    return out


def _progress(cfg, backend, m):
    idle = "-" if m["gpu_idle_fraction"] is None else "%.1f%%" % (100 * m["gpu_idle_fraction"])
    print(
        "  bs %4d, %.1f ms: %-15s %9.0f tokens/s  prep %7.1f us/step  GPU idle %s"
        % (cfg.batch_size, cfg.forward_ms, backend, m["tokens_per_s"], m["prep_us_per_step"], idle),
        file=sys.stderr,
        flush=True,
    )


# ------------------------------------------------------------------------------------------- report


def checks(rows):
    by = {(r["batch_size"], r["forward_ms"]): r["backends"] for r in rows}
    out = []

    def ratio(bs, ms, a, b):
        backends = by.get((bs, ms), {})
        if a not in backends or b not in backends:
            return None
        return paired_ratio(backends, a, b)

    def add(what, r, need):
        out.append(_report.check(what, r, ">= %g" % need, None if r is None else r >= need))

    for bs, ms in sorted(by):
        add(
            "bs %d, %g ms: pinstage_static / packed_buffer tokens/s" % (bs, ms),
            ratio(bs, ms, "pinstage_static", "packed_buffer"),
            STATIC_OF_PACKED,
        )
        if ms in (0.2, 1.0):
            add(
                "bs %d, %g ms: pinstage_static / ideal_same_host tokens/s" % (bs, ms),
                ratio(bs, ms, "pinstage_static", "ideal_same_host"),
                STATIC_OF_SAME_HOST,
            )
        if ms == 1.0:
            add(
                "bs %d, 1 ms: pinstage_static / ideal tokens/s" % bs,
                ratio(bs, ms, "pinstage_static", "ideal"),
                STATIC_OF_IDEAL_1MS,
            )
            add(
                "bs %d, 1 ms: pinstage_state / ideal tokens/s" % bs,
                ratio(bs, ms, "pinstage_state", "ideal"),
                STATE_OF_IDEAL_1MS,
            )
        if ms == 0.2 and bs in (1, 8):
            for backend in ("pinstage_list", "pinstage_state"):
                add(
                    "bs %d, 0.2 ms: %s / blocking tokens/s" % (bs, backend),
                    ratio(bs, ms, backend, "blocking"),
                    STAGE_OVER_BLOCKING_SMALL,
                )
    return out


def round_ratios(a_runs, b_runs):
    """Each round's tokens/s of one backend over another's. A round runs the two close together in
    time (rotated, not shuffled), so a drift between rounds (the host's or the GPU's clocks) cancels;
    a ratio of the medians would mix rounds."""
    return [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(a_runs, b_runs)]


def paired_ratio(backends, a, b):
    """Backend a's tokens/s over b's: the median of the rounds' ratios (round_ratios)."""
    return statistics.median(round_ratios(backends[a]["runs"], backends[b]["runs"]))


def _fraction(s):
    """0.989 [.979-.999]: a median fraction and its range over the rounds."""
    lo, hi = s["of_ideal_range"]
    return "%.3f [%s-%s]" % (s["of_ideal"], ("%.3f" % lo).lstrip("0"), ("%.3f" % hi).lstrip("0"))


def print_tables(rows):
    """Per forward time: each backend's tokens/s as a fraction of the ideal's (median [min-max] over
    the rounds), then its median host preparation on decode-only steps and on steps with a prefill."""
    names = [n for n in BACKENDS if n in rows[0]["backends"]]
    for ms in sorted({r["forward_ms"] for r in rows}):
        cells = [r for r in rows if r["forward_ms"] == ms]
        print()
        print(
            "forward %.1f ms: tokens/s as a fraction of the ideal's, median [min-max] of %d rounds"
            % (ms, len(cells[0]["backends"]["ideal"]["runs"]))
        )
        table = [["backend"] + ["bs %d" % r["batch_size"] for r in cells]]
        for name in names:
            table.append([name] + [_fraction(r["backends"][name]) for r in cells])
        table.append(["ideal tokens/s"] + ["%.0f" % r["backends"]["ideal"]["tokens_per_s"] for r in cells])
        for label, (a, b) in GAINS.items():
            if a in names and b in names:
                table.append([label] + ["%.3fx" % paired_ratio(r["backends"], a, b) for r in cells])
        _report.print_table(table)
        print()
        print("forward %.1f ms: host prep us per step, median: decode-only steps / steps with a prefill" % ms)
        prep = [["backend"] + ["bs %d" % r["batch_size"] for r in cells]]
        for name in names:
            prep.append(
                [name]
                + [
                    "%s / %s"
                    % tuple(
                        "-" if r["backends"][name][k] is None else "%.0f" % r["backends"][name][k]
                        for k in ("decode_prep_us", "prefill_prep_us")
                    )
                    for r in cells
                ]
            )
        _report.print_table(prep)
    print()
    for name in names:
        print("  %-16s %s" % (name, BACKENDS[name].title))
    for label, (a, b) in GAINS.items():
        print("  %-16s %s / %s tokens/s" % (label, a, b))
    for name in UNSAFE:
        other = {
            (r["batch_size"], r["forward_ms"]): r["backends"][name]["requests_with_other_tokens_range"][1]
            for r in rows
            if name in r["backends"]
        }
        if any(other.values()):
            print(
                "  %s generated other tokens (its race) for requests at (bs, forward ms): %s"
                % (name, {k: v for k, v in other.items() if v})
            )


def plot(path, rows, meta):
    names = [n for n in BACKENDS if n != "ideal" and n in rows[0]["backends"]]
    panels = [
        (
            "forward %.1f ms" % ms,
            {
                name: [(r["batch_size"], r["backends"][name]["of_ideal"]) for r in rows if r["forward_ms"] == ms]
                for name in names
            },
        )
        for ms in sorted({r["forward_ms"] for r in rows})
    ]
    _report.plot_panels(
        path,
        panels,
        meta,
        xlabel="batch size",
        ylabel="tokens/s / ideal's",
        yscale="linear",
        title="Decode loop: each backend as a fraction of the ideal",
        panel_width=4.5,
        dashed={"ideal_same_host"},
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,8,64,256")
    p.add_argument("--forward-ms", default="0.2,1,5")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds over every backend, in rotated order (>= 3 for the figures that count)",
    )
    p.add_argument(
        "--backends",
        default=None,
        help="comma-separated subset (default: all this pinstage has; 'ideal' is needed for the fractions)",
    )
    p.add_argument("--quick", action="store_true", help="fewer steps, sizes and rounds (a smoke run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=os.path.join(HERE, "out", "decode_loop.json"))
    args = p.parse_args(argv)
    _timing.pin_to_one_core()
    dev = torch.device(args.device)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    forwards = [float(s) for s in args.forward_ms.split(",")]
    steps, repeats = args.steps, args.repeats
    backends = args.backends.split(",") if args.backends else list(BACKENDS)
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or "ideal" not in backends:
        p.error(
            "--backends: %s (available: %s; 'ideal' must be one)"
            % ("unknown " + ", ".join(unknown) if unknown else "no ideal", ", ".join(BACKENDS))
        )
    if args.quick:
        sizes = [s for s in sizes if s in (1, 64)] or sizes[:1]
        forwards, steps, repeats = forwards[:1], min(steps, 40), 1
    cycles = GpuBusy().cycles_per_us if dev.type == "cuda" else 0.0
    meta = _report.machine_meta()
    print(
        "Decode loop on %s (torch %s): %d timed steps per run, %d round(s) per backend"
        % (meta["gpu"] or "the CPU", meta["torch"], steps, repeats)
    )
    rows = []

    def report(found, complete):
        titles = {n: BACKENDS[n].title for n in backends}
        return dict(
            meta=meta, steps=steps, repeats=repeats, backends=titles, results=rows, checks=found, complete=complete
        )

    for ms in forwards:
        for bs in sizes:
            cfg = Config(batch_size=bs, forward_ms=ms, steps=steps, warmup_steps=5 if args.quick else 20)
            rows.append(
                {"batch_size": bs, "forward_ms": ms, "backends": run_config(cfg, dev, cycles, repeats, backends)}
            )
            # Written after every configuration: a run stopped by a time box keeps the ones it finished.
            _report.write_json(args.json, report([], False))
    print_tables(rows)
    print(
        "(tokens/s: tokens generated per second of wall time; prep: host time per step preparing and staging the "
        "step's inputs; ideal: the same device work with every input already on the device)"
    )
    found = checks(rows) if dev.type == "cuda" else []
    _report.print_checks(found)
    _report.write_json(args.json, report(found, True))
    if dev.type == "cuda":
        plot(os.path.splitext(args.json)[0] + ".png", rows, meta)


if __name__ == "__main__":
    main()

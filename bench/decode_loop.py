#!/usr/bin/env python3
"""An overlap scheduler in miniature: continuous batching over a small decoder, each backend's way of
getting the per-step host data onto the GPU, side by side in one process with one workload.

Per decode step the host builds step k+1's inputs while the GPU runs step k: seq_lens,
req_pool_indices and out_cache_loc for the decode graph, and the sampling batch (temperatures,
top-p/top-k/min-p, penalties) for the sampler. The next input ids stay on the device (the sampled
tokens of the step before); the sampled tokens come back to the host one step late and are recorded
per request. Requests arrive in bursts, are prefilled (write_cache_indices fills req_to_token from
a shared cached prefix and the new slots; some want input logprobs, so the logits indices are built),
decode with mixed greedy / sampled settings and penalties, and finish at different lengths.

The device step: a decoder of a few layers (attention over a KV cache through req_to_token) captured
in a CUDA graph per batch-size bucket, its static inputs filled by a device copy (blocking, pinned,
pinstage over request lists) or by pinstage.stage_into (pinstage over batch state), padded with a
calibrated busy-wait kernel inside the graph so that a step takes --forward-ms; then penalties,
temperature, top-k/top-p/min-p and sampling, eager.

Backends:
  blocking        list-of-requests builders with torch.tensor(..., device=): waits for the GPU
  pinned          list-of-requests builders, pinned tensors + .to(non_blocking=True)
  pinstage_list   list-of-requests builders on pinstage (a Python gather, one stage_many each)
  pinstage_state  BatchState builders (numpy columns, one stage_many each) and stage_into
  ideal           the same device work with every input already on the device (no host preparation)
Every backend must generate the same tokens (asserted). Results: tokens/s, steps/s, host time per
step spent preparing inputs, and the GPU's idle fraction between steps (CUDA events).
"""
import argparse
import dataclasses
import os
import sys
import time
from typing import Dict, List, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import pinstage  # noqa: E402
from pinstage.builders import (  # noqa: E402
    BatchState, Request, SamplingParams, build_decode_inputs, build_logprob_indices, build_sampling_batch,
    write_cache_indices,
)

BACKENDS = ["blocking", "pinned", "pinstage_list", "pinstage_state"]
PENDING = -1  # an output token sampled on the device, not read back yet

# Checks (same run, H200).
STAGE_OVER_BLOCKING_SMALL = 1.25  # either pinstage path, bs 1-8, 0.2 ms forward
STATE_OVER_PINNED_256 = 1.15  # batch state, bs 256, 0.2 ms
STATE_OF_IDEAL_1MS = 0.97
STATE_OF_IDEAL_256_02MS = 0.90


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


# --------------------------------------------------------------------------------------------- model

class TinyDecoder:
    """Embedding, a few pre-norm attention + MLP layers over a KV cache addressed through
    req_to_token (slot = req_to_token[row, position]), and the logits."""

    def __init__(self, cfg, device):
        g = torch.Generator(device="cpu").manual_seed(cfg.seed)
        d, h = cfg.d_model, cfg.n_heads
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32

        def w(*shape, scale=0.05):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

        self.cfg, self.device, self.dtype = cfg, device, dt
        self.embed = w(cfg.vocab, d, scale=1.0)
        self.layers = [dict(qkv=w(d, 3 * d), out=w(d, d), up=w(d, 4 * d), down=w(4 * d, d)) for _ in range(cfg.n_layers)]
        self.lm_head = w(d, cfg.vocab)
        self.rows = 2 * cfg.batch_size + 8  # request rows; then the shared prefix's row and a padding row
        self.prefix_row, self.pad_row = self.rows, self.rows + 1
        self.req_to_token = torch.zeros((self.rows + 2, cfg.max_ctx), dtype=torch.int32, device=device)
        slots = (self.rows + 2) * cfg.max_ctx
        self.k_cache = [torch.zeros((slots, h, d // h), dtype=dt, device=device) for _ in self.layers]
        self.v_cache = [torch.zeros((slots, h, d // h), dtype=dt, device=device) for _ in self.layers]

    def reset(self):
        """Empty req_to_token and the KV cache (in place: the decode graphs hold these tensors), so
        that a run reads only what its own cache builder wrote."""
        self.req_to_token.zero_()
        for cache in self.k_cache + self.v_cache:
            cache.zero_()

    def _attend(self, q, layer, rows, positions):
        """q [n, h, dh] of tokens at `positions` of requests in req_to_token `rows`: attention over
        positions 0..position of each."""
        cfg = self.cfg
        slots = self.req_to_token[rows].long()  # [n, max_ctx]
        k = self.k_cache[layer][slots]  # [n, max_ctx, h, dh]
        v = self.v_cache[layer][slots]
        scores = torch.einsum("nhd,nchd->nhc", q, k).float() / (q.shape[-1] ** 0.5)
        mask = torch.arange(cfg.max_ctx, device=q.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(mask[:, None, :], float("-inf"))
        return torch.einsum("nhc,nchd->nhd", scores.softmax(-1).to(v.dtype), v)

    def forward(self, input_ids, rows, positions, out_cache_loc):
        """Tokens at `positions` of requests in `rows`; their K/V go to slots out_cache_loc. Returns
        the final hidden states [n, d]."""
        cfg = self.cfg
        hd = cfg.d_model // cfg.n_heads
        # Each token's slot in its row of req_to_token (prefill rows were filled by write_cache_indices
        # already; a decode token's slot is written here, as SGLang's decode does).
        self.req_to_token[rows, positions] = out_cache_loc.to(torch.int32)
        x = self.embed[input_ids]
        n = x.shape[0]
        for i, layer in enumerate(self.layers):
            hn = F.rms_norm(x, (cfg.d_model,))
            q, k, v = (hn @ layer["qkv"]).split(cfg.d_model, dim=-1)
            self.k_cache[i][out_cache_loc] = k.reshape(n, cfg.n_heads, hd)
            self.v_cache[i][out_cache_loc] = v.reshape(n, cfg.n_heads, hd)
            a = self._attend(q.reshape(n, cfg.n_heads, hd), i, rows, positions).reshape(n, cfg.d_model)
            x = x + a @ layer["out"]
            x = x + F.gelu(F.rms_norm(x, (cfg.d_model,)) @ layer["up"]) @ layer["down"]
        return F.rms_norm(x, (cfg.d_model,))

    def logits(self, hidden):
        return (hidden @ self.lm_head).float()


class DecodeGraphs:
    """The decode step (forward + logits) per batch-size bucket: a CUDA graph over static inputs
    (input_ids, seq_lens, req_pool_indices, out_cache_loc), padded with a busy-wait kernel to the
    target step time. On the CPU, plain calls."""

    BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

    def __init__(self, model, forward_ms, cycles_per_us):
        self.model, self.forward_ms, self.cycles_per_us = model, forward_ms, cycles_per_us
        self.entries = {}

    def inputs(self, bs):
        """The static inputs of bs's bucket, entries bs.. reset to the padding row (entries a larger
        batch filled before would otherwise write K/V into live requests' slots)."""
        e = self._entry(next(b for b in self.BUCKETS if b >= bs))
        if e["filled"] > bs:
            m = self.model
            e["inputs"][1][bs:].fill_(1)
            e["inputs"][2][bs:].fill_(m.pad_row)
            e["inputs"][3][bs:].fill_(m.pad_row * m.cfg.max_ctx)
        e["filled"] = bs
        return e["inputs"]

    def run(self, bs):
        e = self._entry(next(b for b in self.BUCKETS if b >= bs))
        if e["graph"] is None:
            e["out"] = self._step(e["inputs"], 0)
        else:
            e["graph"].replay()
        return e["out"][:bs]

    def _step(self, inputs, pad_cycles):
        input_ids, seq_lens, rows, out_loc = inputs
        hidden = self.model.forward(input_ids, rows, seq_lens - 1, out_loc)
        if pad_cycles:
            torch.cuda._sleep(pad_cycles)
        return self.model.logits(hidden)

    def _entry(self, bucket):
        if bucket in self.entries:
            return self.entries[bucket]
        m = self.model
        dev = m.device
        inputs = (
            torch.zeros(bucket, dtype=torch.int64, device=dev),
            torch.ones(bucket, dtype=torch.int64, device=dev),
            torch.full((bucket,), m.pad_row, dtype=torch.int64, device=dev),
            torch.full((bucket,), m.pad_row * m.cfg.max_ctx, dtype=torch.int64, device=dev),
        )
        entry = {"inputs": inputs, "graph": None, "out": None, "filled": 0}
        if dev.type == "cuda":
            entry["graph"], entry["out"] = self._capture(inputs)
        self.entries[bucket] = entry
        return entry

    def _capture(self, inputs):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(inputs, 0)
        torch.cuda.current_stream().wait_stream(side)
        bare = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bare):
            self._step(inputs, 0)
        pad_us = max(0.0, self.forward_ms * 1000.0 - 1000.0 * _replay_ms(bare))
        del bare
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._step(inputs, int(pad_us * self.cycles_per_us))
        return graph, out


def _replay_ms(graph, n=20):
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def sleep_cycles_per_us():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) * 1000.0)


# ------------------------------------------------------------------------------------------- sampling

def sample(logits, batch, rows, counts, generator):
    """Penalties (from the output-token counts of each request's row), temperature, top-k / top-p /
    min-p and sampling, as SGLang's sampler and penalizers apply them; greedy rows take the argmax.
    No operation here waits for the GPU: sampling is an exponential race (argmax of p / Exp(1)) rather
    than torch.multinomial, and the counts grow by scatter_add_ rather than index_put_(accumulate=True),
    both of which synchronise on CUDA."""
    if batch.penalties is not None:
        c = counts[rows].float()  # [bs, vocab]
        freq, pres, rep = batch.penalties.unbind(-1)
        logits = logits - freq[:, None] * c - pres[:, None] * (c > 0)
        scale = torch.where(c > 0, rep[:, None], torch.ones_like(logits))
        logits = torch.where(logits < 0, logits * scale, logits / scale)
    greedy = logits.argmax(-1)
    if batch.is_all_greedy:
        tokens = greedy
    else:
        probs = (logits / batch.temperatures).softmax(-1)
        race = torch.empty_like(probs).exponential_(generator=generator).clamp_(min=1e-20)
        if batch.need_top_p or batch.need_top_k or batch.need_min_p:
            sorted_probs, order = probs.sort(-1, descending=True)
            keep = torch.ones_like(sorted_probs, dtype=torch.bool)
            if batch.need_top_k:
                keep &= torch.arange(probs.shape[-1], device=probs.device)[None, :] < batch.top_ks[:, None]
            if batch.need_top_p:
                keep &= (sorted_probs.cumsum(-1) - sorted_probs) < batch.top_ps[:, None]
            if batch.need_min_p:
                keep &= sorted_probs >= batch.min_ps[:, None] * sorted_probs[:, :1]
            sampled = order.gather(-1, (sorted_probs * keep / race).argmax(-1, keepdim=True)).squeeze(-1)
        else:
            sampled = (probs / race).argmax(-1)
        tokens = torch.where(batch.top_ks == 1, greedy, sampled)
    flat = rows * counts.shape[1] + tokens
    counts.view(-1).scatter_add_(0, flat, torch.ones_like(flat, dtype=counts.dtype))
    return tokens


# ---------------------------------------------------------------------------------------- the loop

class Running:
    """A request in the batch: its spec, its Request (what the builders read) and its progress."""

    def __init__(self, spec, row, prefix_len):
        prompt = list(range(1, prefix_len + 1)) + list(spec.prompt)  # the cached prefix is the prompt's head
        self.spec, self.prefix_len = spec, prefix_len
        self.request = Request(prompt, [], req_pool_idx=row, sampling_params=spec.params)
        self.generated = 0  # tokens sampled on the device so far

    @property
    def seq_len(self):
        return len(self.request.origin_input_ids) + self.generated


class PrefillInputs(NamedTuple):
    ids: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_rows: torch.Tensor
    indices: object
    batch: object
    cache_rows: tuple = None  # (rows, prefix slot tensors, extend_lens, out_cache_loc): write_cache_indices's input
    cache_write: tuple = None  # the ideal's ((row, column) device indices, values) for those writes


def for_the_ideal(recorded):
    """A run's recorded inputs with each prefill's cache write turned into device index tensors
    (made before the ideal's timed run), so that the ideal does that write without host work."""
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
    the device inputs are kept, and with `replay` they are used instead of preparing any (the ideal)."""

    def __init__(self, backend, cfg, model, graphs, specs, record=None, replay=None):
        self.backend, self.cfg, self.model, self.graphs = backend, cfg, model, graphs
        self.dev = model.device
        self.cuda = self.dev.type == "cuda"
        self.builder_backend = "pinstage" if backend.startswith("pinstage") else backend
        self.pending_specs = list(specs)
        self.running: List[Running] = []
        self.state = BatchState(capacity=2 * cfg.batch_size) if backend == "pinstage_state" else None
        self.free_rows = list(range(model.rows))
        self.tokens: Dict[int, List[int]] = {}
        self.generator = torch.Generator(device=self.dev).manual_seed(cfg.seed)
        self.counts = torch.zeros((model.rows + 2, cfg.vocab), dtype=torch.int32, device=self.dev)
        self.next_ids = torch.zeros(0, dtype=torch.int64, device=self.dev)
        self.inflight = []  # (read-back handle, request ids in batch order)
        self.prep_s, self.step_prep, self.step_events = [], 0.0, []
        self.record, self.replay = record, replay
        self.filling = True  # until the batch first reaches its size, requests are admitted every step
        self.step_index = 0
        model.reset()
        self.prefix_slots = self._make_prefix()

    def prepared(self, build):
        """build()'s device inputs (timed as host preparation), or the recorded ones when replaying."""
        if self.replay is not None:
            return self.replay.pop(0)
        t0 = time.perf_counter()
        value = build()
        self.step_prep += time.perf_counter() - t0
        if self.record is not None:
            self.record.append(value)
        return value

    def stage(self, items):
        from pinstage.builders._backend import stage

        return stage(items, self.builder_backend, None, self.dev)

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
            new.append(Running(spec, self.free_rows.pop(0), cfg.prefix_len if spec.use_prefix else 0))
        return new

    def prefill_inputs(self, new):
        m, max_ctx = self.model, self.cfg.max_ctx
        b = self.builder_backend
        rows = [r.request.req_pool_idx for r in new]
        prefix_lens = [r.prefix_len for r in new]
        extend_lens = [len(r.spec.prompt) for r in new]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        starts = [r.spec.logprob_start for r in new]
        token_rows = [row for row, e in zip(rows, extend_lens) for _ in range(e)]
        positions = [p + i for p, e in zip(prefix_lens, extend_lens) for i in range(e)]
        ids, rows_d, pos_d, loc_d, req_rows = self.stage([
            ([t for r in new for t in r.spec.prompt], torch.int64),
            (token_rows, torch.int64),
            (positions, torch.int64),
            ([row * max_ctx + pos for row, pos in zip(token_rows, positions)], torch.int64),
            (rows, torch.int64),
        ])
        if self.state is not None:
            indices = build_logprob_indices(np.array(extend_lens), np.array(starts), device=self.dev)
        else:
            indices = build_logprob_indices(extend_lens, starts, backend=b, device=self.dev)
        batch = build_sampling_batch([r.spec.params for r in new], backend=b, device=self.dev)
        prefixes = [self.prefix_slots[: r.prefix_len] for r in new]
        write_cache_indices(m.req_to_token, rows, prefixes, prefix_lens, seq_lens, extend_lens, loc_d, backend=b)
        return PrefillInputs(ids, rows_d, pos_d, loc_d, req_rows, indices, batch, cache_rows=(rows, prefixes, extend_lens, loc_d))

    def prefill(self, staged):
        """Extends the new requests' prompts after their cached prefix and samples each one's first
        token (with the input logprobs some of them asked for). Returns the first tokens (device)."""
        ids, rows_d, pos_d, loc_d, req_rows, indices, batch = staged[:7]
        m = self.model
        if staged.cache_write is not None:  # the ideal: write_cache_indices's writes, from device tensors
            m.req_to_token.index_put_(*staged.cache_write)
        kept = m.logits(m.forward(ids, rows_d, pos_d, loc_d)[indices.pruned_row_indices])
        kept[indices.input_logprob_indices].log_softmax(-1)  # the input logprobs an engine would return
        return sample(kept[indices.sample_indices], batch, req_rows, self.counts, self.generator)

    # ----- decode

    def decode_inputs(self, static, bs):
        """((seq_lens, req_pool_indices, out_cache_loc) on the device, sampling batch), staged the
        backend's way. The batch-state backend writes the graph's static inputs with stage_into and
        gives None for the first."""
        max_ctx = self.cfg.max_ctx
        if self.state is not None:
            st = self.state
            seq, rows = st.column("seq_lens"), st.column("req_pool_indices")
            pinstage.stage_into(seq, static[1][:bs])
            pinstage.stage_into(rows, static[2][:bs])
            pinstage.stage_into(rows * max_ctx + seq - 1, static[3][:bs])
            return None, st.sampling_batch(device=self.dev)
        b = self.builder_backend
        inputs = build_decode_inputs([r.request for r in self.running], backend=b, device=self.dev)
        (loc,) = self.stage([([r.request.req_pool_idx * max_ctx + r.seq_len - 1 for r in self.running], torch.int64)])
        batch = build_sampling_batch([r.spec.params for r in self.running], backend=b, device=self.dev)
        return (inputs.seq_lens, inputs.req_pool_indices, loc), batch

    def decode(self, staged, batch):
        """The graph on the static inputs (filled from `staged` unless stage_into wrote them), then
        sampling. Returns the sampled tokens (device)."""
        bs = len(self.running)
        static = self.graphs.inputs(bs)
        if staged is not None:
            for dst, src in zip(static[1:], staged):
                dst[:bs].copy_(src, non_blocking=True)
        static[0][:bs].copy_(self.next_ids, non_blocking=True)
        return sample(self.graphs.run(bs), batch, static[2][:bs], self.counts, self.generator)

    # ----- bookkeeping

    def fetch(self, tokens, rids):
        if self.backend.startswith("pinstage") or self.replay is not None:
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
        prefill_staged = self.prepared(lambda: self.prefill_inputs(new)) if new else None
        for r in new:
            r.generated = 1
            r.request.output_ids.append(PENDING)  # its first token, sampled by the prefill
            self.running.append(r)
            if self.state is not None:
                self.state.add(r.request)
        if len(self.running) >= self.cfg.batch_size or not self.pending_specs:
            self.filling = False
        decode_staged = None
        if self.running:
            bs = len(self.running)
            decode_staged = self.prepared(lambda: self.decode_inputs(self.graphs.inputs(bs), bs))
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
        if new:
            first = self.prefill(prefill_staged)
            self.fetch(first, [r.spec.rid for r in new])
            self.next_ids = torch.cat([self.next_ids, first])
        if self.running:
            tokens = self.decode(*decode_staged)
            self.fetch(tokens, [r.spec.rid for r in self.running])
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.step_events.append((begin, end))
        if self.running:
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
                        self.counts[r.request.req_pool_idx].zero_()
                self.running = [self.running[i] for i in keep]
                if self.state is not None:
                    self.state.filter(keep)
                # The device tokens follow the batch: the kept rows' tokens feed the next step.
                (keep_d,) = self.prepared(lambda: self.stage([(keep, torch.int64)]))
                tokens = tokens[keep_d]
            self.next_ids = tokens
        self.prep_s.append(self.step_prep)
        self.read_back()
        self.step_index += 1

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
        "prep_us_per_step": 1e6 * float(np.median(loop.prep_s)) if loop.prep_s else 0.0,
        "gpu_idle_fraction": gpu_idle_fraction(loop.step_events) if loop.cuda else None,
    }


def gpu_idle_fraction(events):
    """Share of the span from the first step's launches to the last step's end in which the GPU sat
    between one step's end and the next step's launches: waiting for the host."""
    if len(events) < 2:
        return None
    gaps = sum(max(0.0, events[i][1].elapsed_time(events[i + 1][0])) for i in range(len(events) - 1))
    span = events[0][0].elapsed_time(events[-1][1])
    return gaps / span if span > 0 else None


def run_config(cfg, dev, cycles_per_us):
    """Every backend and the ideal on one (batch size, forward time); asserts equal tokens."""
    specs = make_workload(cfg, 2 * cfg.batch_size + (cfg.warmup_steps + cfg.steps) * max(1, cfg.batch_size // 8) + 8)
    model = TinyDecoder(cfg, dev)
    graphs = DecodeGraphs(model, cfg.forward_ms, cycles_per_us)
    results, reference, recorded = {}, None, []
    for backend in BACKENDS:
        tokens, metrics = run_backend(backend, cfg, model, graphs, specs,
                                      record=recorded if backend == "pinstage_list" else None)
        if reference is None:
            reference = tokens
        else:
            _assert_same_tokens(backend, tokens, reference)
        results[backend] = metrics
        _progress(cfg, backend, metrics)
    # The list run's device inputs are separate tensors: keeping them for the replay costs it nothing.
    tokens, results["ideal"] = run_backend("ideal", cfg, model, graphs, specs, replay=for_the_ideal(recorded))
    _assert_same_tokens("ideal", tokens, reference)
    _progress(cfg, "ideal", results["ideal"])
    return results


def _assert_same_tokens(backend, tokens, reference):
    bad = sorted(rid for rid in set(reference) | set(tokens) if reference.get(rid) != tokens.get(rid))
    assert not bad, "%s generated other tokens than %s for %d request(s), e.g. request %d: %s vs %s" % (
        backend, BACKENDS[0], len(bad), bad[0], tokens.get(bad[0]), reference.get(bad[0]))


def _progress(cfg, backend, m):
    idle = "-" if m["gpu_idle_fraction"] is None else "%.1f%%" % (100 * m["gpu_idle_fraction"])
    print("  bs %4d, %.1f ms: %-15s %9.0f tokens/s  prep %7.1f us/step  GPU idle %s" % (
        cfg.batch_size, cfg.forward_ms, backend, m["tokens_per_s"], m["prep_us_per_step"], idle),
        file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- report

def checks(rows):
    by = {(r["batch_size"], r["forward_ms"]): r["backends"] for r in rows}
    out = []

    def tps(bs, ms, backend):
        return by[(bs, ms)][backend]["tokens_per_s"] if (bs, ms) in by else None

    for bs in (1, 8):
        for backend in ("pinstage_list", "pinstage_state"):
            a, b = tps(bs, 0.2, backend), tps(bs, 0.2, "blocking")
            r = None if a is None or b is None else a / b
            out.append(_report.check("bs %d, 0.2 ms: %s / blocking tokens/s" % (bs, backend), r,
                                     ">= %g" % STAGE_OVER_BLOCKING_SMALL, None if r is None else r >= STAGE_OVER_BLOCKING_SMALL))
    a, b = tps(256, 0.2, "pinstage_state"), tps(256, 0.2, "pinned")
    r = None if a is None or b is None else a / b
    out.append(_report.check("bs 256, 0.2 ms: batch state / pinned tokens/s", r, ">= %g" % STATE_OVER_PINNED_256,
                             None if r is None else r >= STATE_OVER_PINNED_256))
    for (bs, ms), backends in sorted(by.items()):
        need = STATE_OF_IDEAL_1MS if ms == 1.0 else STATE_OF_IDEAL_256_02MS if (bs, ms) == (256, 0.2) else None
        if need is None:
            continue
        r = backends["pinstage_state"]["tokens_per_s"] / backends["ideal"]["tokens_per_s"]
        out.append(_report.check("bs %d, %g ms: batch state / ideal tokens/s" % (bs, ms), r, ">= %.2f" % need, r >= need))
    return out


def print_table(rows):
    names = BACKENDS + ["ideal"]
    table = [["forward", "bs"] + ["%s tok/s" % n for n in names] + ["prep us/step (" + ", ".join(BACKENDS) + ")",
                                                                    "GPU idle % (" + ", ".join(names) + ")"]]
    for r in rows:
        b = r["backends"]
        table.append(["%.1f ms" % r["forward_ms"], r["batch_size"]] + ["%.0f" % b[n]["tokens_per_s"] for n in names]
                     + [" / ".join("%.0f" % b[n]["prep_us_per_step"] for n in BACKENDS),
                        " / ".join("-" if b[n]["gpu_idle_fraction"] is None else "%.0f" % (100 * b[n]["gpu_idle_fraction"])
                                   for n in names)])
    _report.print_table(table)


def plot(path, rows, meta):
    panels = [("forward %.1f ms" % ms, {name: [(r["batch_size"], r["backends"][name]["tokens_per_s"])
                                               for r in rows if r["forward_ms"] == ms]
                                        for name in BACKENDS + ["ideal"]})
              for ms in sorted({r["forward_ms"] for r in rows})]
    _report.plot_panels(path, panels, meta, xlabel="batch size", ylabel="tokens/s", title="Decode loop: tokens/s",
                        panel_width=4.5, dashed={"ideal"})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="1,8,64,256")
    p.add_argument("--forward-ms", default="0.2,1,5")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="fewer steps and sizes (a smoke run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=os.path.join(HERE, "out", "decode_loop.json"))
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    forwards = [float(s) for s in args.forward_ms.split(",")]
    steps = args.steps
    if args.quick:
        sizes, forwards, steps = [s for s in sizes if s in (1, 64)] or sizes[:1], forwards[:1], min(steps, 40)
    cycles = sleep_cycles_per_us() if dev.type == "cuda" else 0.0
    meta = _report.machine_meta()
    print("Decode loop on %s (torch %s): %d timed steps per run" % (meta["gpu"] or "the CPU", meta["torch"], steps))
    rows = []
    for ms in forwards:
        for bs in sizes:
            cfg = Config(batch_size=bs, forward_ms=ms, steps=steps, warmup_steps=5 if args.quick else 20)
            rows.append({"batch_size": bs, "forward_ms": ms, "backends": run_config(cfg, dev, cycles)})
    print_table(rows)
    print("(tok/s: tokens generated per second of wall time; prep: host time per step building and staging the "
          "step's inputs; GPU idle: share of the loop's span between one step's device work and the next's; ideal: "
          "the same device work with every input already on the device)")
    found = checks(rows) if dev.type == "cuda" else []
    _report.print_checks(found)
    _report.write_json(args.json, {"meta": meta, "steps": steps, "results": rows, "checks": found})
    if dev.type == "cuda":
        plot(os.path.splitext(args.json)[0] + ".png", rows, meta)


if __name__ == "__main__":
    main()

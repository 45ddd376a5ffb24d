"""The decode loop's device side: a small decoder over a KV cache, its sampler, and the decode step
(forward, logits, sampler) captured in a CUDA graph per batch-size bucket over static inputs that
every backend of the loop fills its own way."""

import torch
import torch.nn.functional as F
from _baselines import allocation_bytes

import pinstage
from pinstage.builders import TOP_K_ALL


class TinyDecoder:
    """Embedding, a few pre-norm attention + MLP layers over a KV cache addressed through
    req_to_token (slot = req_to_token[row, position]), and the logits. `counts` holds each request
    row's output-token counts for the penalties."""

    def __init__(self, cfg, device):
        g = torch.Generator(device="cpu").manual_seed(cfg.seed)
        d, h = cfg.d_model, cfg.n_heads
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32

        def w(*shape, scale=0.05):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

        self.cfg, self.device, self.dtype = cfg, device, dt
        self.embed = w(cfg.vocab, d, scale=1.0)
        self.layers = [
            dict(qkv=w(d, 3 * d), out=w(d, d), up=w(d, 4 * d), down=w(4 * d, d)) for _ in range(cfg.n_layers)
        ]
        self.lm_head = w(d, cfg.vocab)
        self.rows = 2 * cfg.batch_size + 8  # request rows; then the shared prefix's row and a padding row
        self.prefix_row, self.pad_row = self.rows, self.rows + 1
        self.req_to_token = torch.zeros((self.rows + 2, cfg.max_ctx), dtype=torch.int32, device=device)
        slots = (self.rows + 2) * cfg.max_ctx
        self.k_cache = [torch.zeros((slots, h, d // h), dtype=dt, device=device) for _ in self.layers]
        self.v_cache = [torch.zeros((slots, h, d // h), dtype=dt, device=device) for _ in self.layers]
        self.counts = torch.zeros((self.rows + 2, cfg.vocab), dtype=torch.int32, device=device)

    def reset(self):
        """Empty req_to_token, the KV cache and the counts (in place: the decode graphs hold these
        tensors), so that a run reads only what its own builders wrote."""
        self.req_to_token.zero_()
        self.counts.zero_()
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


# ------------------------------------------------------------------------------------------- sampling

_HASH_MOD = 2147483647  # 2^31 - 1: products below 2^31 * 48271 stay exact in int64


def race_noise(rows, seq_lens, token_ids):
    """Exp(1) noise per (request row, sequence length, token id) from a fixed integer hash: the same
    on every backend and inside a CUDA graph, where a generator's state would not advance."""
    x = ((rows * 65599 + seq_lens) % _HASH_MOD)[:, None] * 4099 + token_ids
    for _ in range(3):
        x = (x % _HASH_MOD) * 48271 % _HASH_MOD
    u = (x.float() + 0.5) / _HASH_MOD
    return (-torch.log(u)).clamp_(min=1e-20)


def sample(logits, params, rows, seq_lens, counts):
    """Penalties (from the output-token counts of each request's row), temperature, top-k / top-p /
    min-p and sampling, as SGLang's sampler and penalizers apply them; rows with top_k 1 take the
    argmax. Every branch is computed for every row (no host-side flags), so that one CUDA graph
    holds the whole sampler. No operation waits for the GPU: sampling is an exponential race (argmax
    of p / Exp(1)), the counts grow by scatter_add_.

    params: SamplerInputs (temperatures, top_ps, top_ks, min_ps: [n]; penalties: (frequency,
    presence, repetition) [n] each, or None)."""
    if params.penalties is not None:
        c = counts[rows].float()  # [n, vocab]
        freq, pres, rep = params.penalties
        logits = logits - freq[:, None] * c - pres[:, None] * (c > 0)
        scale = torch.where(c > 0, rep[:, None], torch.ones_like(logits))
        logits = torch.where(logits < 0, logits * scale, logits / scale)
    greedy = logits.argmax(-1)
    probs = (logits / params.temperatures[:, None]).softmax(-1)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep = torch.arange(probs.shape[-1], device=probs.device)[None, :] < params.top_ks[:, None]
    keep &= (sorted_probs.cumsum(-1) - sorted_probs) < params.top_ps[:, None]
    keep &= sorted_probs >= params.min_ps[:, None] * sorted_probs[:, :1]
    race = race_noise(rows, seq_lens, order)
    sampled = order.gather(-1, (sorted_probs * keep / race).argmax(-1, keepdim=True)).squeeze(-1)
    tokens = torch.where(params.top_ks == 1, greedy, sampled)
    flat = rows * counts.shape[1] + tokens
    counts.view(-1).scatter_add_(0, flat, torch.ones_like(flat, dtype=counts.dtype))
    return tokens


class SamplerInputs:
    """What sample() reads per row."""

    def __init__(self, temperatures, top_ps, top_ks, min_ps, penalties):
        self.temperatures, self.top_ps, self.top_ks, self.min_ps = temperatures, top_ps, top_ks, min_ps
        self.penalties = penalties

    @classmethod
    def of_batch(cls, batch):
        """From a builders' SamplingBatch (temperatures [n, 1], penalties [n, 3] or None)."""
        penalties = None if batch.penalties is None else tuple(batch.penalties.unbind(-1))
        return cls(batch.temperatures.view(-1), batch.top_ps, batch.top_ks, batch.min_ps, penalties)


# ------------------------------------------------------------------------------------ static inputs


def static_fields(model):
    """The decode graph's per-step inputs: name -> (dtype, fill). Rows past the batch hold the fill
    value: the padding row's address (so that a bucket's padding rows write only the padding row's
    K/V), neutral sampling parameters."""
    pad, max_ctx = model.pad_row, model.cfg.max_ctx
    return {
        "seq_lens": (torch.int64, 1),
        "req_pool_indices": (torch.int64, pad),
        "out_cache_loc": (torch.int64, pad * max_ctx),
        "temperatures": (torch.float32, 1.0),
        "top_ps": (torch.float32, 1.0),
        "top_ks": (torch.int32, TOP_K_ALL),
        "min_ps": (torch.float32, 0.0),
        "frequency_penalties": (torch.float32, 0.0),
        "presence_penalties": (torch.float32, 0.0),
        "repetition_penalties": (torch.float32, 1.0),
    }


# The fields whose padding matters for correctness (a stale address would write K/V into a live
# request's slots); the sampling parameters of padding rows only shape outputs nobody reads.
ADDRESS_FIELDS = ("seq_lens", "req_pool_indices", "out_cache_loc")


def make_static_inputs(fields, max_bs, device):
    """pinstage.StaticInputs over `fields` (name -> (dtype, fill)): one allocation, a view per field."""
    return pinstage.StaticInputs(
        {name: pinstage.Field(dt, (), fill) for name, (dt, fill) in fields.items()}, max_bs=max_bs, device=device
    )


class Snapshot:
    """A device copy of every static input, taken once, restored with one device-to-device copy."""

    def __init__(self, inputs):
        self.whole = allocation_bytes(inputs)
        self.saved = self.whole.clone()

    def restore(self):
        self.whole.copy_(self.saved, non_blocking=True)


def sampler_inputs(views):
    """SamplerInputs over a dict of static views."""
    return SamplerInputs(
        views["temperatures"],
        views["top_ps"],
        views["top_ks"],
        views["min_ps"],
        (views["frequency_penalties"], views["presence_penalties"], views["repetition_penalties"]),
    )


# ------------------------------------------------------------------------------------------ graphs


class DecodeGraphs:
    """The decode step (forward, logits, sampler) per batch-size bucket, reading the static inputs
    (and the input ids, which come from the device), padded with a busy-wait kernel so that a step
    takes `forward_ms` on the device. Every bucket is captured up front, on padding rows only (a
    capture's warm-up runs the sampler, which counts tokens). On the CPU, plain calls."""

    BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

    def __init__(self, model, forward_ms, cycles_per_us):
        self.model, self.forward_ms, self.cycles_per_us = model, forward_ms, cycles_per_us
        self.fields = static_fields(model)
        top = self.bucket(model.cfg.batch_size)
        self.inputs = make_static_inputs(self.fields, top, model.device)
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=model.device)
        self.reset_inputs()
        self.graphs, self.outputs = {}, {}
        if model.device.type == "cuda":
            for bucket in (b for b in self.BUCKETS if b <= top):
                self.graphs[bucket], self.outputs[bucket] = self._capture(bucket)
            model.reset()

    def bucket(self, bs):
        return next(b for b in self.BUCKETS if b >= bs)

    def reset_inputs(self, rows=slice(None)):
        """Every field's fill value in `rows` (all by default)."""
        for name, (_, fill) in self.fields.items():
            self.inputs[name][rows].fill_(fill)

    def pad(self, start, stop):
        """The address fields' fill values in rows start..stop (after a batch shrank)."""
        for name in ADDRESS_FIELDS:
            self.inputs[name][start:stop].fill_(self.fields[name][1])

    def run(self, bs):
        """The step for the first bs rows; returns the sampled tokens [bs] (device)."""
        bucket = self.bucket(bs)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][:bs]
        return self._step(bucket, 0)[:bs]

    def _step(self, bucket, pad_cycles):
        v = {name: self.inputs[name][:bucket] for name in self.fields}
        rows, seq_lens = v["req_pool_indices"], v["seq_lens"]
        hidden = self.model.forward(self.input_ids[:bucket], rows, seq_lens - 1, v["out_cache_loc"])
        if pad_cycles:
            torch.cuda._sleep(pad_cycles)
        return sample(self.model.logits(hidden), sampler_inputs(v), rows, seq_lens, self.model.counts)

    def _capture(self, bucket):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(bucket, 0)
        torch.cuda.current_stream().wait_stream(side)
        bare = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bare):
            self._step(bucket, 0)
        pad_us = max(0.0, self.forward_ms * 1000.0 - 1000.0 * _replay_ms(bare))
        del bare
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._step(bucket, int(pad_us * self.cycles_per_us))
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

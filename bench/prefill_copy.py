#!/usr/bin/env python3
"""stage_prefill's copy on a device: its one kernel launch (the cache rows' kernel also copies the
staged items, its SMs reading the ring's mapped pinned memory over PCIe; above 256 KB of items the
copy engine copies first) against the copy engine's copy followed by the rows' launch, host and
device time, at item sizes from kilobytes to megabytes.

Methods, each staging one prefill of 64 requests (prompt ids, positions and out_cache_loc, int64 per
new token) and pointing req_to_token's rows at a 16-slot prefix and at out_cache_loc:
  one_launch        stage_prefill(items, ..., CacheRows(...)): one ring region, one kernel launch
                    (over 256 KB: a cudaMemcpyAsync and the launch)
  copy_then_launch  stage_prefill(items, ...) without cache rows (one cudaMemcpyAsync), then
                    write_cache_indices on the staged out_cache_loc (one launch)
  copy_only         stage_prefill(items, ...) without cache rows: the copy engine's part alone
Host and device time as bench/static_inputs.py takes them (a loop queued behind a sleeping kernel;
CUDA events around each call, all queued behind a sleep so that the calls run back to back), the
methods interleaved in every repeat, medians after warm-up. Each size is first checked: both ways
must give torch.tensor's items and the expected rows. Without a GPU only that check runs (on CPU
tensors), and no figures are written.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import _timing  # noqa: E402
import torch  # noqa: E402
from microbench import GpuBusy, ratio  # noqa: E402
from static_inputs import measure_cell  # noqa: E402

from pinstage.builders import CacheRows, stage_prefill, write_cache_indices  # noqa: E402

REQUESTS = 64
PREFIX = 16
TOKENS = [256, 4096, 8192, 32768, 200_000]  # 6 KB, 96 KB, 192 KB, 768 KB, 4.8 MB of items
BYTES_PER_TOKEN = 24  # three int64 items
RING_SHARE = 4 << 20  # bytes one timed loop may stage: half the default ring, no overflow blocks
METHODS = ["one_launch", "copy_then_launch", "copy_only"]
# The aim: the launch's copy costs the device at most this much more than the copy engine's.
DEVICE_OVER_COPY_ENGINE = 1.10


def prefill(tokens, dev):
    """One prefill's arguments: items, lengths, logprob starts and its cache rows (out_cache_loc is item 2)."""
    per_request = tokens // REQUESTS
    lens = [per_request] * REQUESTS
    max_ctx = PREFIX + per_request
    req_to_token = torch.zeros(REQUESTS, max_ctx, dtype=torch.int32, device=dev)
    rows = list(range(REQUESTS))
    ids = [(7 * i) % 32000 for i in range(per_request * REQUESTS)]
    positions = [PREFIX + i for _ in rows for i in range(per_request)]
    locations = [row * max_ctx + p for row in rows for p in range(PREFIX, max_ctx)]
    items = [(ids, torch.int64), (positions, torch.int64), (locations, torch.int64)]
    prefix = torch.arange(PREFIX, dtype=torch.int64, device=dev)
    cache = CacheRows(req_to_token, rows, [prefix] * REQUESTS, [PREFIX] * REQUESTS, [max_ctx] * REQUESTS, 2)
    return items, lens, [per_request] * REQUESTS, cache


def copy_then_launch(items, lens, starts, c, dev):
    """The staged items of a copy without cache rows, then the rows written by their own launch."""
    staged, _ = stage_prefill(items, lens, starts, device=dev)
    write_cache_indices(
        c.req_to_token, c.req_pool_indices, c.prefix_tensors, c.prefix_lens, c.seq_lens, lens, staged[2]
    )
    return staged


def verify(args, dev):
    """Both ways give the same tensors and rows as torch.tensor and a loop would (else the times compare nothing)."""
    items, lens, starts, c = args
    one, _ = stage_prefill(items, lens, starts, c, device=dev)
    rows_one = c.req_to_token.clone()
    c.req_to_token.zero_()
    two = copy_then_launch(items, lens, starts, c, dev)
    want = [torch.tensor(v, dtype=dtype) for v, dtype in items]
    expected = torch.cat([c.prefix_tensors[0].cpu().expand(REQUESTS, PREFIX), want[2].view(REQUESTS, -1)], 1)
    for got in (one, two):
        assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want)), "staged items differ from torch.tensor's"
    assert torch.equal(rows_one.cpu().long(), expected) and torch.equal(c.req_to_token.cpu().long(), expected), (
        "req_to_token's rows are not the prefix and out_cache_loc"
    )


def methods_for(args, dev):
    items, lens, starts, c = args
    return {
        "one_launch": lambda: stage_prefill(items, lens, starts, c, device=dev),
        "copy_then_launch": lambda: copy_then_launch(items, lens, starts, c, dev),
        "copy_only": lambda: stage_prefill(items, lens, starts, device=dev),
    }


def run(args, report):
    dev = torch.device("cuda", torch.cuda.current_device())
    busy = GpuBusy()
    cells = []
    for tokens in args.tokens:
        one_prefill = prefill(tokens, dev)
        verify(one_prefill, dev)
        item_bytes = BYTES_PER_TOKEN * tokens
        steps = max(1, min(args.steps, RING_SHARE // item_bytes))
        result = measure_cell(methods_for(one_prefill, dev), args.repeats, steps, busy, args.warmup)
        cells.append({"tokens": tokens, "item_bytes": item_bytes, "steps_per_loop": steps, "methods": result})
        print("  %d tokens measured" % tokens, file=sys.stderr)
    report["sections"]["gpu"] = cells


def print_tables(report):
    cells = report["sections"]["gpu"]
    for kind in ("host", "device"):
        print()
        print("stage_prefill of %d requests with cache rows: %s us per call, median [min-max]" % (REQUESTS, kind))
        rows = [["item bytes"] + METHODS + ["one_launch / copy_then_launch"]]
        for cell in cells:
            t = {k: cell["methods"][k][kind] for k in METHODS}
            spread = [_report.fmt_us(t[k]["median_us"], (t[k]["min_us"], t[k]["max_us"])) for k in METHODS]
            r = ratio(t["one_launch"]["median_us"], t["copy_then_launch"]["median_us"])
            rows.append([cell["item_bytes"]] + spread + [_report.fmt_ratio(r)])
        _report.print_table(rows)


def checks(report):
    out = []
    for cell in report["sections"]["gpu"]:
        m = cell["methods"]
        r = ratio(m["one_launch"]["device"]["median_us"], m["copy_then_launch"]["device"]["median_us"])
        out.append(
            _report.check(
                "%d item bytes: one_launch / copy_then_launch, device time" % cell["item_bytes"],
                r,
                "<= %g" % DEVICE_OVER_COPY_ENGINE,
                None if r is None else r <= DEVICE_OVER_COPY_ENGINE,
            )
        )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=32, help="calls per timed loop (fewer where the items are large)")
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS, help="new tokens per prefill (a multiple of 64)")
    p.add_argument("--json", default=os.path.join(HERE, "out", "prefill_copy.json"))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        for tokens in args.tokens:
            verify(prefill(tokens, "cpu"), "cpu")
        print("bench/prefill_copy.py: both ways verified on the CPU; no GPU is visible, so nothing was timed")
        return 0
    _timing.pin_to_one_core()
    report = {"meta": dict(_report.machine_meta(), repeats=args.repeats, requests=REQUESTS), "sections": {}}
    gpu = report["meta"]["gpu"]
    print("stage_prefill's one launch against a copy and a launch on %s (torch %s)" % (gpu, torch.__version__))
    run(args, report)
    print_tables(report)
    report["checks"] = checks(report)
    _report.print_checks(report["checks"])
    _report.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

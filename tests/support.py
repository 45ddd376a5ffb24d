"""What the tests share: the checkout's root, the device list, child processes, builder requests and
their comparison, a busy stream. pinstage is imported inside the helpers: conftest imports ROOT from
here before it puts the checkout on sys.path."""

import os
import subprocess
import sys
import textwrap

import gpu_busy
import pytest
import torch
from staging_reference import assert_same_tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every test that runs on both: the CUDA case carries the marker (conftest skips it without a GPU).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BATCH_SIZES = [0, 1, 37, 4096]

# Far longer than any builder call on any GPU (about 25 ms on an H200): the stream is still busy
# when a builder that does not wait for it returns.
BUSY_MS = 25


def run_child(script, timeout=180):
    """Runs `script` (dedented) in a fresh interpreter that imports this checkout's pinstage, with
    faulthandler on, so that a crash or a hang fails one test instead of the run. Returns its stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the child did not finish in %d s (a wait that cannot end)" % timeout)
    assert proc.returncode == 0, "exit %d\nstdout:\n%s\nstderr:\n%s" % (
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr[-3000:],
    )
    return proc.stdout


# Defined in every expect_in_child child: expect(fn, exc_type, *fragments) runs fn and prints what it
# raised; it exits non-zero if fn returned or raised something else, and then a plain staging on
# DEVICE must still work.
_EXPECT = textwrap.dedent(
    """
    import sys, torch, pinstage

    def expect(fn, exc_type, *fragments):
        try:
            fn()
        except exc_type as exc:
            message = str(exc)
            missing = [f for f in fragments if f not in message]
            if missing:
                print("MESSAGE LACKS", missing, "IN", repr(message))
                sys.exit(3)
            print("RAISED", type(exc).__name__, message[:200])
        except BaseException as exc:
            print("WRONG EXCEPTION", type(exc).__name__, str(exc)[:500])
            sys.exit(2)
        else:
            print("NO EXCEPTION")
            sys.exit(1)
        after = pinstage.stage_to_device([1, 2, 3], torch.int64, device=DEVICE)
        assert after.cpu().tolist() == [1, 2, 3], after
    """
)


def expect_in_child(body, device="cpu", timeout=300):
    """run_child of `body` (dedented) with expect() and DEVICE defined."""
    return run_child(_EXPECT + "DEVICE = %r\n" % device + textwrap.dedent(body), timeout)


def random_requests(rng, bs):
    """bs decode requests: prompts of 1-6 tokens, 0-3 output tokens (often none), random rows."""
    from pinstage.builders import Request

    return [
        Request(
            [rng.randrange(1 << 17) for _ in range(rng.randint(1, 6))],
            [rng.randrange(1 << 17) for _ in range(rng.choice([0, 0, 1, 3]))],
            req_pool_idx=rng.randrange(8192),
        )
        for _ in range(bs)
    ]


def random_params(rng, bs):
    """bs SamplingParams mixing greedy and sampled requests, ints where floats are expected (common
    in engine code), with and without seeds and penalties."""
    from pinstage.builders import SamplingParams

    return [
        SamplingParams(
            temperature=rng.choice([0.0, 0.5, 0.7, 1, 1.3]),
            top_p=rng.choice([1.0, 1, 0.9, 0.5]),
            top_k=rng.choice([-1, -1, 1, 20, 50]),
            min_p=rng.choice([0.0, 0, 0.05]),
            sampling_seed=rng.choice([None, rng.randrange(1 << 40)]),
            frequency_penalty=rng.choice([0.0, 0.0, 0.0, 0.5]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.0, 1.2]),
        )
        for _ in range(bs)
    ]


def assert_fields_equal(actual, expected):
    """Two builder results (dataclasses): tensors equal in value, dtype, shape and device; the rest ==."""
    for name, value in vars(expected).items():
        other = getattr(actual, name)
        if isinstance(value, torch.Tensor):
            assert_same_tensor(other, value, name)
        else:
            assert other == value, (name, other, value)


def torch_tensors(fields, device):
    """(name, values, dtype) fields as torch.tensor makes them on `device`, no ring: the reference
    for the tensors a builder stages from those fields."""
    return [torch.tensor(values, dtype=dtype, device=device) for _, values, dtype in fields]


def reference_decode_inputs(requests, device):
    from pinstage.builders import DecodeInputs
    from pinstage.builders.decode import decode_fields

    return DecodeInputs(*torch_tensors(decode_fields(requests), device))


def reference_last_token_ids(requests, device):
    from pinstage.builders.decode import last_token_ids

    return torch.tensor(last_token_ids(requests), dtype=torch.int64, device=device)


def reference_sampling_batch(params, device, enable_deterministic_sampling=False):
    from pinstage.builders.sampling import sampling_fields

    fields, batch = sampling_fields(params, enable_deterministic_sampling)
    return batch(torch_tensors(fields, device))


def run_while_stream_busy(build, stream=None):
    """build() right after a long kernel was queued on `stream` (default: the current one), with
    synchronisation forbidden. Returns the result and whether the kernel was still running when
    build() returned: a builder that waited for the stream would find it done. The caller compares
    the result after synchronising."""
    import pinstage.testing

    done = gpu_busy.busy(BUSY_MS, stream)
    with pinstage.testing.no_sync():
        result = build()
    return result, not done.query()


def profiled_on_device(fn):
    """(fn()'s result, the names of every profiled event, the names of those on the device's
    timeline: copies and kernels), the device synchronised inside the profile so that they are in it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    events = prof.events()
    on_device = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return result, [e.name for e in events], on_device


def is_host_to_device_copy(name):
    """Whether a profiled device event is a host-to-device copy ("Memcpy HtoD (Pinned -> Device)")."""
    return "memcpy" in name.lower() and "htod" in name.lower().replace(" ", "")

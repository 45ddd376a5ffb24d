"""Inputs that once crashed the interpreter or corrupted its heap; each must now raise cleanly.

Every case runs in a subprocess, so that a regression fails its test (non-zero exit, a signal)
instead of killing the whole test run. The child prints the exception it got and then checks that
pinstage still works (and, for stage_into, that `out` was left as it was): support.expect_in_child.
"""
import pytest
from support import DEVICES, expect_in_child


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_stage_into_out_replaced_during_conversion(device, shape):
    """An element's conversion replaces out's storage with a smaller one: nothing may be written
    with the byte count checked before."""
    out = expect_in_child(
        """
        out = torch.full((4096,), 7, dtype=torch.float32, device=DEVICE)
        small = torch.zeros(2, dtype=torch.int8, device=DEVICE)

        class Shrinks:
            def __float__(self):
                out.data = small
                return 1.0

        # The fast path declines the last element, so torch.tensor converts the list and runs __float__.
        data = [1.0] * 4095 + [Shrinks()]
        if %r == "nested":
            data = [data]
            out.data = torch.full((1, 4096), 7, dtype=torch.float32, device=DEVICE)
        expect(lambda: pinstage.stage_into(data, out), RuntimeError, "out changed")
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        assert out.dtype == torch.int8 and out.cpu().tolist() == [0, 0], out
        print("out intact")
        """ % shape,
        device,
    )
    assert "out intact" in out


@pytest.mark.parametrize("device", DEVICES)
def test_nesting_beyond_torch_limit(device):
    expect_in_child(
        """
        x = [1]
        for _ in range(300000):
            x = [x]
        expect(lambda: pinstage.stage_to_device(x, torch.int64, device=DEVICE), ValueError, "too many dimensions")
        y = [1]
        for _ in range(128):
            y = [y]
        expect(lambda: pinstage.stage_to_device(y, torch.int64, device=DEVICE), ValueError, "too many dimensions")
        z = [1]
        for _ in range(127):
            z = [z]
        assert pinstage.stage_to_device(z, torch.int64, device=DEVICE).dim() == 128
        expect(lambda: pinstage.stage_many([([1], torch.int64), (x, torch.int64)], device=DEVICE), ValueError,
               "item 1", "too many dimensions")
        """,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_sizes_that_overflow(device):
    expect_in_child(
        """
        expect(lambda: pinstage.stage_to_device(range(2**61), torch.int64, device=DEVICE), RuntimeError, "overflow")
        if DEVICE == "cuda":
            # Each item fits int64 bytes, their sum does not.
            expect(lambda: pinstage.stage_many([(range(2**62), torch.int8)] * 3), RuntimeError, "2**63")
            out = torch.empty(2, dtype=torch.int64, device="cuda")
            expect(lambda: pinstage.stage_into(range(2**61), out), RuntimeError, "overflow")
        """,
        device,
    )


def test_cache_index_bounds_that_would_overflow():
    expect_in_child(
        """
        big = 2**63 - 2
        table = torch.zeros((2, 8), dtype=torch.int32)
        out_cache_loc = torch.arange(4, dtype=torch.int64)
        one = lambda v, dt=torch.int64: torch.tensor([v], dtype=dt)
        prefix = torch.zeros(1, dtype=torch.int64)
        call = lambda offset, seq: torch.ops.pinstage.write_cache_indices(
            table, one(0), [prefix], one(0), one(seq), one(offset), out_cache_loc)
        expect(lambda: call(big, 4), ValueError, "outside out_cache_loc")
        expect(lambda: call(-big, 4), ValueError, "outside out_cache_loc")
        assert table.abs().sum().item() == 0, table
        from pinstage.builders import write_cache_indices
        expect(lambda: write_cache_indices(table, [0, 1], [prefix[:0], prefix[:0]], [0, 0], [big, big], [big, big],
                                           out_cache_loc), ValueError)
        """
    )


def test_device_indices_out_of_range():
    expect_in_child(
        """
        count = torch.cuda.device_count()
        # Without CUDA an in-range request is refused for that reason (RuntimeError, as torch does).
        missing = ValueError if count else RuntimeError
        for index, exc in ((256, missing), (200, missing), (count, missing), (2**70, ValueError), (-1, ValueError)):
            expect(lambda: pinstage.stage_to_device([1], torch.int64, device=index), exc)
            expect(lambda: pinstage.stage_to_device([1], torch.int64, device="cuda:%d" % index), (ValueError, RuntimeError))
            expect(lambda: pinstage.stats(device=index), (ValueError, RuntimeError))
        if count:
            expect(lambda: pinstage.stage_to_device([1], torch.int64, device=256), ValueError, "256", str(count))
        """
    )


def test_wrong_exception_types_are_mended():
    expect_in_child(
        """
        expect(lambda: pinstage.configure(ring_bytes=2**70), OverflowError, "ring_bytes")
        expect(lambda: pinstage.configure(ring_bytes=-(2**70)), ValueError, "ring_bytes")
        expect(lambda: pinstage.stage_to_device([1], torch.int64, device="cuda:\\udc80"), ValueError, "device")
        expect(lambda: pinstage.configure(on_full="wa\\udc80it"), ValueError, "on_full")

        """
    )


def test_objects_that_only_claim_to_be_tensors():
    expect_in_child(
        """
        class Impostor:
            @property
            def __class__(self):
                return torch.Tensor

        fake = Impostor()
        assert isinstance(fake, torch.Tensor)
        expect(lambda: pinstage.stage_into([1.0], fake), TypeError, "out must be a torch.Tensor")
        expect(lambda: pinstage.stage_to_device(fake, torch.float32, device=DEVICE), (TypeError, RuntimeError, ValueError))
        expect(lambda: pinstage.stage_many([(fake, torch.float32)], device=DEVICE), (TypeError, RuntimeError, ValueError))
        expect(lambda: pinstage.stage_to_device([1], torch.int64, stream=fake), TypeError, "stream")
        """
    )

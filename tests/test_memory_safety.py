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
        """
        % shape,
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
            expect(
                lambda: pinstage.stage_to_device([1], torch.int64, device="cuda:%d" % index), (ValueError, RuntimeError)
            )
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
        refused = (TypeError, RuntimeError, ValueError)
        expect(lambda: pinstage.stage_to_device(fake, torch.float32, device=DEVICE), refused)
        expect(lambda: pinstage.stage_many([(fake, torch.float32)], device=DEVICE), refused)
        expect(lambda: pinstage.stage_to_device([1], torch.int64, stream=fake), TypeError, "stream")
        """
    )


# torch.ops.pinstage: each op reads a caller's value once, and write_cache_indices refuses a table
# that overlaps itself or its inputs (the cases once wrote past the table or the op's outputs).
@pytest.mark.parametrize("device", DEVICES)
def test_write_cache_indices_refuses_a_table_overlapping_its_inputs_or_itself(device):
    """req_to_token an int32 view of the int64 buffer holding seq_lens: request 0's write changed
    seq_lens[1], which the op read again and wrote past the table. A stride-0 or row-overlapping
    table has requests write each other's rows. Each is refused before anything is written."""
    out = expect_in_child(
        """
        op = torch.ops.pinstage.write_cache_indices
        i64 = dict(dtype=torch.int64, device=DEVICE)

        def call(table, rows, prefixes, prefix_lens, seq_lens, out_cache_loc):
            offsets = torch.zeros(len(rows), **i64)
            offsets[1:] = torch.cumsum(seq_lens - prefix_lens, 0)[:-1]
            return lambda: op(table, rows, prefixes, prefix_lens, seq_lens, offsets, out_cache_loc)

        def fresh():
            buf = torch.zeros(64, **i64)  # 128 int32: a 4 x 32 table
            table = buf.view(torch.int32).view(4, 32)
            return buf, table

        rows, none = torch.tensor([0, 1], **i64), [torch.zeros(0, **i64)] * 2
        zeros, lens = torch.zeros(2, **i64), torch.tensor([2, 20], **i64)
        loc = torch.arange(42, **i64)
        cases = []
        buf, table = fresh()
        buf[0], buf[1] = 4, 2  # the red team's case: seq_lens lies in the table's row 0
        cases.append((buf, table, call(table, rows, none, zeros, buf[0:2], loc), "overlaps seq_lens"))
        buf, table = fresh()
        cases.append((buf, table, call(table, buf[20:22], none, zeros, lens, loc), "overlaps req_pool_indices"))
        buf, table = fresh()
        cases.append((buf, table, call(table, rows, none, zeros, lens, buf[8:50]), "overlaps out_cache_loc"))
        buf, table = fresh()
        cases.append((buf, table, call(table, rows, none, buf[60:62], lens, loc), "overlaps prefix_lens"))
        buf, table = fresh()
        prefix = [buf[40:45], torch.zeros(0, **i64)]
        cases.append((buf, table, call(table, rows, prefix, torch.tensor([5, 0], **i64), lens + 3,
                                       torch.arange(45, **i64)), "request 0: req_to_token overlaps its prefix"))
        # A strided table (torch cannot tell): seq_lens inside its row 2.
        wide = torch.zeros(4, 64, dtype=torch.int32, device=DEVICE)
        cases.append((wide, wide[:, :32], call(wide[:, :32], rows, none, zeros, wide[2, :4].view(torch.int64),
                                                loc), "overlaps seq_lens"))
        one_row = torch.zeros(1, 32, dtype=torch.int32, device=DEVICE)
        cases.append((one_row, one_row, call(one_row.expand(4, 32), rows, none, zeros, lens, loc),
                      "req_to_token's rows share memory"))
        flat = torch.zeros(64, dtype=torch.int32, device=DEVICE)
        cases.append((flat, flat, call(flat.as_strided((4, 32), (8, 1)), rows, none, zeros, lens, loc),
                      "req_to_token's rows share memory"))
        if DEVICE == "cpu":  # two storages over one numpy buffer: torch's storage test calls them apart
            import numpy as np

            shared = np.zeros(64, dtype=np.int64)
            shared[0], shared[1] = 4, 2
            np_table = torch.from_numpy(shared.view(np.int32).reshape(4, 32))
            np_seq_lens = torch.from_numpy(shared[0:2])
            cases.append((np_table, np_table, call(np_table, rows, none, zeros, np_seq_lens, loc), "overlaps seq_lens"))
        for memory, table, fn, fragment in cases:
            before = memory.clone()
            expect(fn, RuntimeError, fragment)
            assert torch.equal(memory, before), fragment  # nothing written
        # The same memory, not overlapping: served.
        buf, table = fresh()
        call(buf.view(torch.int32)[:64].view(2, 32), rows, none, zeros, torch.tensor([2, 3], **i64),
             torch.arange(5, **i64))()
        torch.testing.assert_close(buf.view(torch.int32)[:64].view(2, 32)[:, :3].cpu(),
                                   torch.tensor([[0, 1, 0], [2, 3, 4]], dtype=torch.int32))
        """,
        device=device,
    )
    assert out.count("RAISED RuntimeError") == (9 if device == "cpu" else 8), out


def test_write_cache_indices_reads_each_value_once_while_another_thread_writes_them():
    """Another thread flips seq_lens between a valid and an out-of-bounds value through .numpy()
    while the op runs (with the GIL released): each call is checked and served from one reading,
    so it writes its rows or refuses, and never writes past them."""
    out = expect_in_child(
        """
        import threading, time
        # A call long enough (a million cells) for the writer to run while it writes, on a busy machine.
        bs, width, n = 4096, 512, 256
        table = torch.full((bs + 1, width), -7, dtype=torch.int32)
        rows = torch.arange(bs)
        prefixes = [torch.zeros(0, dtype=torch.int64)] * bs
        prefix_lens = torch.zeros(bs, dtype=torch.int64)
        seq_lens = torch.full((bs,), n, dtype=torch.int64)
        offsets = torch.arange(bs) * n
        loc = torch.arange(bs * n)
        view, stop = seq_lens.numpy(), threading.Event()

        def writer():
            while not stop.is_set():
                view[:] = 10**6
                view[:] = n

        thread = threading.Thread(target=writer)
        thread.start()
        served = refused = 0
        end = time.monotonic() + 1.0
        try:
            while time.monotonic() < end:
                try:
                    torch.ops.pinstage.write_cache_indices(table, rows, prefixes, prefix_lens, seq_lens, offsets, loc)
                    served += 1
                except ValueError:
                    refused += 1
        finally:
            stop.set()
            thread.join()
        assert (table[bs] == -7).all() and (table[:, n:] == -7).all(), "written past the rows"
        print("SERVED", served, "REFUSED", refused)
        """
    )
    assert "SERVED" in out, out


def test_logprob_indices_reads_each_length_once_while_another_thread_writes_them():
    """Another thread flips the lengths in their numpy array while the indices are computed from
    it: an op that ran with the GIL released once sized its outputs from one reading and filled
    them from another, writing past them. Each result must be one batch's indices."""
    out = expect_in_child(
        """
        import threading, time
        import numpy as np
        from pinstage.builders import logprob_index_tensors
        bs = 256
        view = np.ones(bs, dtype=np.int64)
        starts = np.zeros(bs, dtype=np.int64)
        stop = threading.Event()

        def writer():
            while not stop.is_set():
                view[:] = 64
                view[:] = 1

        thread = threading.Thread(target=writer)
        thread.start()
        calls = 0
        end = time.monotonic() + 1.0
        try:
            while time.monotonic() < end:
                sample, logprob, pruned, kept = logprob_index_tensors(view, starts)
                # starts are 0: every kept row carries an input logprob.
                assert logprob.numel() == kept.numel() == int(pruned.sum()) == int(sample[-1]) + 1
                assert kept.tolist() == list(range(kept.numel()))
                calls += 1
        finally:
            stop.set()
            thread.join()
        print("CALLS", calls)
        """
    )
    assert "CALLS" in out, out

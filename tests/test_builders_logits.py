import numpy as np
import pytest
import torch
from staging_reference import assert_same_tensor
from support import BATCH_SIZES, DEVICES, assert_fields_equal, run_while_stream_busy

from pinstage.builders import build_logprob_indices, logprob_index_tensors


def reference(lens, starts):
    """SGLang's LogitsProcessor loop (and LogitsMetadata's pruned lens), element by element: the oracle."""
    sample, input_logprob, pruned_lens, rows = [], [], [], []
    sample_pt, logprob_pt, row_pt = -1, 0, 0
    for start, n in zip(starts, lens):
        kept_from = start - 1 if n == start else start
        rows.extend(range(row_pt + kept_from, row_pt + n))
        row_pt += n
        sample_pt += n - kept_from
        sample.append(sample_pt)
        input_logprob.extend(logprob_pt + i for i in range(n - start))
        logprob_pt += n - kept_from
        pruned_lens.append(n - start)
    return [torch.tensor(v, dtype=torch.int64) for v in (sample, input_logprob, pruned_lens, rows)]


def random_batch(rng, bs):
    lens = [rng.randint(1, 40) for _ in range(bs)]
    starts = [rng.choice([n, n, rng.randint(0, n), 0]) for n in lens]
    return lens, starts


def check_against_reference(result, lens, starts):
    sample, input_logprob, pruned_lens, rows = reference(lens, starts)
    assert_same_tensor(result.sample_indices.cpu(), sample, "sample_indices")
    assert_same_tensor(result.input_logprob_indices.cpu(), input_logprob, "input_logprob_indices")
    assert_same_tensor(result.pruned_lens.cpu(), pruned_lens, "pruned_lens")
    assert_same_tensor(result.pruned_row_indices.cpu(), rows, "pruned_row_indices")


@pytest.mark.parametrize("device", DEVICES)
def test_worked_example(device):
    got = build_logprob_indices([4, 5, 6], [0, 5, 3], device=device)
    assert got.sample_indices.tolist() == [3, 4, 7]
    assert got.input_logprob_indices.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert got.pruned_lens.tolist() == [4, 0, 3]
    assert got.pruned_row_indices.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_logprob_indices_equal_the_reference_on_the_device(rng, device, bs):
    lens, starts = random_batch(rng, bs)
    got = build_logprob_indices(lens, starts, device=device)
    expected = reference(lens, starts)
    for name, tensor in zip(("sample_indices", "input_logprob_indices", "pruned_lens", "pruned_row_indices"), expected):
        assert_same_tensor(getattr(got, name), tensor.to(device), name)


@pytest.mark.parametrize("bs", [1, 2, 7, 64, 300])
def test_pruned_lens_count_the_input_logprob_rows(rng, bs):
    """Upstream expands per-request values over the input-logprob rows by pruned_lens: the two must
    agree in every batch, sample-only requests (start == length) included."""
    for _ in range(20):
        lens, starts = random_batch(rng, bs)
        got = build_logprob_indices(lens, starts, device="cpu")
        assert int(got.pruned_lens.sum()) == got.input_logprob_indices.numel()
        assert got.pruned_row_indices.numel() == int(got.sample_indices[-1]) + 1
        assert got.pruned_lens.tolist() == [n - s for n, s in zip(lens, starts)]


def test_numpy_lengths_equal_lists(rng):
    lens, starts = random_batch(rng, 50)
    want = build_logprob_indices(lens, starts, device="cpu")
    for lens_dtype, starts_dtype in ((np.int64, np.int64), (np.int32, np.int32), (np.int64, np.int32)):
        got = build_logprob_indices(
            np.array(lens, dtype=lens_dtype), np.array(starts, dtype=starts_dtype), device="cpu"
        )
        assert_fields_equal(got, want)


def test_cpu_tensor_lengths_equal_lists(rng):
    """Integer CPU tensors are columns too (as write_cache_indices takes them), views included."""
    lens, starts = random_batch(rng, 50)
    want = build_logprob_indices(lens, starts, device="cpu")
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint32):
        got = build_logprob_indices(torch.tensor(lens, dtype=dtype), torch.tensor(starts, dtype=dtype), device="cpu")
        assert_fields_equal(got, want)
    strided = torch.tensor(lens).repeat_interleave(2)[::2]
    assert not strided.is_contiguous()
    assert_fields_equal(build_logprob_indices(strided, torch.tensor(starts), device="cpu"), want)
    negative = torch.tensor([-n for n in lens])._neg_view()  # its values are lens; its memory holds -lens
    assert negative.is_neg()
    assert_fields_equal(build_logprob_indices(negative, torch.tensor(starts), device="cpu"), want)


@pytest.mark.parametrize(
    "lens, error, message",
    [
        (torch.tensor([4.0, 5.0]), TypeError, r"^request 0: extend_seq_lens must be an int, got float 4.0$"),
        (
            torch.tensor([4.0, 5.0], dtype=torch.bfloat16),
            TypeError,
            r"^request 0: extend_seq_lens must be an int, got float",
        ),
        (torch.tensor([True, True]), TypeError, r"^request 0: extend_seq_lens must be an int, got bool True$"),
        (torch.tensor([4, 0]), ValueError, r"^request 1: extend_seq_lens must be >= 1, got 0$"),
        (
            torch.tensor([[4, 5]]),
            TypeError,
            r"^extend_seq_lens must be a list of ints, one per request, got nested Tensor$",
        ),
        (torch.tensor(4), TypeError, r"^extend_seq_lens must be a list of ints, one per request, got a scalar Tensor$"),
        (
            torch.tensor([4, 2**63], dtype=torch.uint64),
            ValueError,
            r"^request 1: extend_seq_lens must fit int64 \(at most 2\*\*63 - 1\), got 9223372036854775808$",
        ),
        (
            torch.tensor([4, 5], device="meta"),
            TypeError,
            r"^extend_seq_lens must be host values \(a list, numpy array or CPU tensor\), got a tensor on meta$",
        ),
    ],
)
def test_tensor_lengths_that_are_not_valid_name_the_problem(lens, error, message):
    with pytest.raises(error, match=message):
        build_logprob_indices(lens, [0, 0], device="cpu")


@pytest.mark.cuda
def test_cuda_tensor_lengths_are_refused():
    """Reading a device tensor's values would wait for the GPU: the host's own values are asked for."""
    with pytest.raises(TypeError, match=r"^extend_seq_lens must be host values .* got a tensor on cuda:0$"):
        build_logprob_indices(torch.tensor([4, 5], device="cuda"), [0, 0], device="cuda")


@pytest.mark.parametrize("bs", [1, 40])
def test_edge_starts(bs):
    lens = [1] * bs
    check_against_reference(build_logprob_indices(lens, [1] * bs, device="cpu"), lens, [1] * bs)
    check_against_reference(build_logprob_indices(lens, [0] * bs, device="cpu"), lens, [0] * bs)


@pytest.mark.parametrize("bs", [3, 40])
@pytest.mark.parametrize(
    "n, start, error, message",
    [
        (0, 0, ValueError, r"request 2: extend_seq_lens must be >= 1"),
        (4, -1, ValueError, r"request 2: extend_logprob_start_lens must be in \[0, extend_seq_lens=4\]"),
        (4, 5, ValueError, r"request 2: extend_logprob_start_lens must be in \[0, extend_seq_lens=4\]"),
        (4, None, TypeError, r"request 2: extend_logprob_start_lens must be an int, got NoneType None"),
        (2.5, 0, TypeError, r"request 2: extend_seq_lens must be an int, got float 2.5"),
        ("4", 0, TypeError, r"request 2: extend_seq_lens must be an int, got str '4'"),
        (
            2**64 - 1,
            0,
            ValueError,
            r"request 2: extend_seq_lens must fit int64 \(at most 2\*\*63 - 1\), got 18446744073709551615",
        ),
        (
            4,
            2**64 - 1,
            ValueError,
            r"request 2: extend_logprob_start_lens must be in \[0, extend_seq_lens=4\], got 18446744073709551615",
        ),
    ],
)
def test_invalid_lengths_name_the_request(bs, n, start, error, message):
    lens, starts = [3] * bs, [1] * bs
    lens[2], starts[2] = n, start
    with pytest.raises(error, match=message):
        build_logprob_indices(lens, starts, device="cpu")


def test_rows_past_int64_are_refused_naming_the_request():
    """lengths == starts == 2**62: the requests' rows add up past 2**63 - 1, where the row indices
    once wrapped to negative values without an error. The largest total that fits is served."""
    lens = [2**62] * 3
    message = rf"request 1: extend_seq_lens {2**62} after {2**62} rows of the requests before it"
    with pytest.raises(RuntimeError, match=message):
        build_logprob_indices(lens, lens, device="cpu")
    with pytest.raises(RuntimeError, match=message):
        logprob_index_tensors(np.array(lens), np.array(lens))
    got = build_logprob_indices([2**62, 2**62 - 1], [2**62, 2**62 - 1], device="cpu")
    assert got.pruned_row_indices.tolist() == [2**62 - 1, 2**63 - 2]
    assert got.sample_indices.tolist() == [0, 1]


@pytest.mark.parametrize("field", ["lens", "starts"])
def test_uint64_beyond_int64_is_named_with_its_value(field):
    """Checked before the cast to int64, which would report 2**64 - 1 as -1."""
    lens = np.array([3, 4, 5], dtype=np.uint64)
    starts = np.array([0, 1, 2], dtype=np.uint64)
    (lens if field == "lens" else starts)[1] = 2**64 - 1
    with pytest.raises(ValueError, match=r"request 1: .* got 18446744073709551615$"):
        build_logprob_indices(lens, starts, device="cpu")


@pytest.mark.parametrize(
    "lens, starts, message",
    [
        (5, 0, r"^extend_seq_lens must be a list of ints, one per request, got a scalar int$"),
        ([5], np.int64(3), r"^extend_logprob_start_lens must be a list of ints, one per request, got a scalar int64$"),
        ([[5]], [[0]], r"^extend_seq_lens must be a list of ints, one per request, got nested list$"),
        (np.array([[5, 6]]), [0, 0], r"^extend_seq_lens must be a list of ints, one per request, got nested ndarray$"),
        ([5], [[0], [1, 2]], r"^extend_logprob_start_lens must be a list of ints, one per request, got nested list$"),
    ],
)
def test_columns_that_are_not_lists_name_the_problem(lens, starts, message):
    with pytest.raises(TypeError, match=message):
        build_logprob_indices(lens, starts, device="cpu")


def test_mismatched_lists_are_rejected():
    with pytest.raises(ValueError, match="extend_seq_lens has 2 entries but extend_logprob_start_lens has 1"):
        build_logprob_indices([1, 2], [0], device="cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("bs", [8, 256])
def test_logits_builder_does_not_wait_for_a_busy_stream(rng, bs):
    lens, starts = random_batch(rng, bs)
    stream = torch.cuda.Stream()
    build = lambda: build_logprob_indices(lens, starts, stream=stream)  # noqa: E731
    build()
    result, still_busy = run_while_stream_busy(build, stream)
    assert still_busy, "the builder returned only after the busy stream finished"
    torch.cuda.synchronize()
    check_against_reference(result, lens, starts)


@pytest.mark.parametrize(
    "lens, starts",
    [
        ([np.uint64(4), 5], [0, 1]),  # numpy reads this mix as float64
        ([4, 5], [np.uint64(0), np.int64(1)]),
        (np.array([4, 5], dtype=object), [0, 1]),
    ],
)
def test_integer_columns_of_mixed_int_types_equal_lists(lens, starts):
    assert_fields_equal(
        build_logprob_indices(lens, starts, device="cpu"), build_logprob_indices([4, 5], [0, 1], device="cpu")
    )


@pytest.mark.parametrize("field", ["lens", "starts"])
def test_a_bool_length_is_refused_not_read_as_an_int(field):
    lens, starts = [4, 5], [0, 1]
    (lens if field == "lens" else starts)[1] = True
    name = "extend_seq_lens" if field == "lens" else "extend_logprob_start_lens"
    with pytest.raises(TypeError, match=rf"^request 1: {name} must be an int, got bool True$"):
        build_logprob_indices(lens, starts, device="cpu")

"""torch.tensor's own conversion, for whatever the compiled fast path declines.

The compiled core converts Python ints, floats and bools (flat or nested lists, tuples, range),
buffers (numpy arrays and scalars, array.array, memoryview, bytearray) and CPU tensors itself.
Whatever it declines (values torch would wrap, round differently or reject, ragged lists, buffers of
a byte order or layout it does not read, any other object) comes here, so results and errors are
torch.tensor's by construction. Errors keep torch's exception
type; the message gains the index, value and dtype of the first element torch refuses.
"""

from typing import cast

import torch

# torch.tensor's nesting limit; the search below never goes deeper (a self-nested list is finite
# only up to Python's recursion limit).
_MAX_DIMS = 128
# The sequences the search descends into; torch.tensor reads anything else as a whole element.
_SEQUENCES = frozenset((list, tuple))


def register_buffer_types():
    """Tell the compiled core which types are numpy arrays and scalars and array.array, so that it
    copies their memory straight into the ring (torch.tensor's casting rules where dtypes differ)."""
    import array

    from . import _C

    try:
        import numpy
    except ImportError:  # pinstage works without numpy; its arrays just cannot be passed then
        _C._register_buffer_types(None, None, array.array)
        return
    _C._register_buffer_types(numpy.ndarray, numpy.generic, array.array)


def torch_tensor(data, dtype):
    """torch.tensor(data, dtype=dtype) on the CPU, with errors that name the offending element."""
    if isinstance(data, torch.Tensor) and not issubclass(type(data), torch.Tensor):
        # torch.tensor would read it as a tensor because its __class__ says so.
        raise TypeError("pinstage: data claims to be a torch.Tensor but is a %s" % type(data).__name__)
    try:
        return _convert(data, dtype)
    except Exception as exc:  # raised again below, with the same type
        error = _with_location(exc, data, dtype)
    # Outside the handler, which would make torch's error its context; the local is dropped so that
    # the error's traceback (which holds this frame) and the frame do not keep each other alive.
    try:
        raise error
    finally:
        del error


def _convert(data, dtype):
    # device="cpu": the core copies these bytes from host memory, whatever torch.set_default_device
    # or a `with torch.device(...)` block says.
    return torch.tensor(data, dtype=dtype, device="cpu")


def _with_location(exc, data, dtype):
    where = _first_refused_element(data, dtype)
    if where is None:
        return remade(exc, "pinstage: dtype %s" % dtype)
    index, value = where
    what = "element " + "".join("[%d]" % i for i in index) if index else "data"
    return remade(exc, "pinstage: %s = %s cannot be converted to %s" % (what, _short_repr(value), dtype))


def remade(exc: BaseException, where: str) -> BaseException:
    """exc's type again with the message "where: exc's message", keeping exc's cause, context, notes
    and traceback, so that a traceback shows the chain a user's conversion code raised; where its
    class cannot be made from one message, exc itself with `where` added as a note (PEP 678). The
    compiled core re-makes its errors ("item 3") with this function too."""
    try:
        text = str(exc)
    except Exception:
        text = "(no message)"
    try:
        made = type(exc)("%s: %s" % (where, text))
        if issubclass(type(made), BaseException):  # else a __new__ gave back something else
            made.__cause__, made.__context__ = exc.__cause__, exc.__context__
            made.__suppress_context__ = exc.__suppress_context__
            notes = getattr(exc, "__notes__", None)
            if isinstance(notes, list):  # PEP 678's form; anything else is left behind
                made.__notes__ = list(notes)
            made = made.with_traceback(exc.__traceback__)  # down to the line that raised it
    except Exception:  # an __init__ of other arguments, attributes that cannot be set
        made = None
    if issubclass(type(made), BaseException):  # type(), not isinstance: a Mock(spec=ValueError) passes that
        return cast(BaseException, made)
    try:
        if where not in getattr(exc, "__notes__", ()):  # an instance raised again: one note per place
            exc.add_note(where)
    except Exception:  # notes that are not a list
        pass
    return exc


def _short_repr(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _converts(data, dtype):
    try:
        # as_tensor for a tensor: the same conversion, without torch.tensor's copy warning.
        if isinstance(data, torch.Tensor):
            torch.as_tensor(data, dtype=dtype, device="cpu")
        else:
            _convert(data, dtype)
    except Exception:
        return False
    return True


def _first_refused_element(data, dtype):
    """(index, value) of the first element, in row-major order, that torch.tensor refuses on its
    own, or of the first sequence whose length breaks the rectangle; None if none is found.

    Linear in the input: a list or tuple met again (x = [x, x]) was already searched and is skipped,
    so shared sub-lists are not walked as a tree; a level of scalars is searched by halving, torch
    converting the left half each time (n/2 + n/4 + ... elements, not one call per element)."""
    return _search(data, dtype, (), set())


def _search(data, dtype, index, searched):
    if type(data) not in _SEQUENCES or len(index) >= _MAX_DIMS:
        return None if _converts(data, dtype) else (index, data)
    if id(data) in searched:  # the caller's data keeps every searched sequence alive meanwhile
        return None
    if not _SEQUENCES.isdisjoint(set(map(type, data))):  # a level of sequences (map and set run in C)
        expected = None
        for i, item in enumerate(data):
            if type(item) in _SEQUENCES:
                if expected is None:
                    expected = len(item)
                elif len(item) != expected:
                    return index + (i,), item
        # A level is all sequences or all scalars: an item of the other kind than the first, which
        # torch will not read beside it (a numpy array beside a list it will), is the one to name.
        first_is_sequence = type(data[0]) in _SEQUENCES
        for i, item in enumerate(data):
            if (type(item) in _SEQUENCES) != first_is_sequence and not _converts([data[0], item], dtype):
                return index + (i,), item
            found = _search(item, dtype, index + (i,), searched)
            if found is not None:
                return found
    else:
        lo, hi = 0, len(data)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _converts(data[lo:mid], dtype):
                lo = mid
            else:
                hi = mid
        if hi - lo == 1 and not _converts(data[lo:hi], dtype):
            return index + (lo,), data[lo]
    searched.add(id(data))
    return None

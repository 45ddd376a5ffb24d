"""Tensors that have no memory of their own, for the tests that check pinstage refuses to copy them."""

import torch


class WrapperTensor(torch.Tensor):
    """A wrapper subclass (the DTensor / torchao style): a null data pointer. Its __torch_dispatch__
    passes every op on as is, as a subclass that forgets to unwrap does, so that the op's own checks
    are what stands between it and a read of address 0."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            return func(*args, **(kwargs or {}))

"""Helpers for tests of code that stages data: proof that nothing synchronises."""

import contextlib

import torch


@contextlib.contextmanager
def no_sync():
    """Any host/device synchronisation inside the block raises.

    Sets torch.cuda.set_sync_debug_mode("error") (torch raises on its synchronising operations) and
    restores the previous mode afterwards; pinstage's one potentially blocking path, on_full="wait"
    on a full ring, honours the same mode and raises too. Without CUDA it only runs the block.
    """
    if not torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)

"""SGLang's write_cache_indices (mem_cache/allocation.py) on pinstage's cache-index kernel.

SGLang stages the prefix tensors' data pointers (pinned tensor, one copy) for a Triton kernel, or,
where Triton is not used, writes each row with several .item() reads per request. pinstage's
write_cache_indices plans the batch from the host copies SGLang already passes in (one C++ pass)
and fills the same req_to_token entries with one kernel, which on CUDA reads those values and the
prefix table from one ring region in place (on the CPU it is a loop), at every batch size. A pool
that writes its table its own way (a subclass overriding `write`), or tensors of other dtypes than
SGLang's usual ones, go to SGLang's function.
"""

import torch

from pinstage.builders import write_cache_indices as pinstage_write_cache_indices


def make_write_cache_indices(sglang_write_cache_indices, table_write):
    """The function to install; `table_write` is ReqToTokenPool.write, the plain table store."""

    def write_cache_indices(*args, **kwargs):
        def sglang_own():
            return sglang_write_cache_indices(*args, **kwargs)

        if kwargs or len(args) != 11:  # SGLang passes its 11 arguments by position
            return sglang_own()
        # The device copies (SGLang's Triton kernel reads them) are not needed: the op reads the host ones.
        out_cache_loc, _, req_pool_indices_cpu, _, prefix_lens_cpu, _, seq_lens_cpu, _, extend_lens_cpu = args[:9]
        prefix_tensors, req_to_token_pool = args[9:]
        table = req_to_token_pool.req_to_token
        if (
            type(req_to_token_pool).write is not table_write
            or table.dtype != torch.int32
            or out_cache_loc.dtype != torch.int64
        ):
            return sglang_own()
        # The requests without a cached prefix share SGLang's one empty CPU tensor, which the op
        # accepts (it is never read). A prefix tensor of another dtype is refused (TypeError) before
        # anything is written: SGLang's function then does it its way. The op checks every entry in
        # C++, so no Python loop over the prefix tensors runs here.
        try:
            pinstage_write_cache_indices(
                table,
                req_pool_indices_cpu,
                prefix_tensors,
                prefix_lens_cpu,
                seq_lens_cpu,
                extend_lens_cpu,
                out_cache_loc,
            )
        except TypeError:
            return sglang_own()
        return None

    return write_cache_indices

"""SGLang's write_cache_indices (mem_cache/allocation.py) on pinstage's cache-index kernel.

SGLang stages the prefix tensors' data pointers (pinned tensor, one copy) for a Triton kernel, or,
where Triton is not used, writes each row with several .item() reads per request. pinstage's
write_cache_indices plans the batch from the host copies SGLang already passes in (one C++ pass),
stages everything in one copy and fills the same req_to_token entries with one kernel, on the CPU
and on CUDA alike. A pool that writes its table its own way (a subclass overriding `write`), or
tensors of other dtypes than SGLang's usual ones, go to SGLang's function.
"""
import torch

from pinstage.builders import write_cache_indices as pinstage_write_cache_indices


def make_write_cache_indices(sglang_write_cache_indices, table_write):
    """The function to install; `table_write` is ReqToTokenPool.write, the plain table store."""
    empty_prefix = {}  # device -> an empty int64 tensor there

    def write_cache_indices(out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor,
                            prefix_lens_cpu, seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu,
                            prefix_tensors, req_to_token_pool):
        table = req_to_token_pool.req_to_token
        device = table.device
        if device not in empty_prefix:
            empty_prefix[device] = torch.empty(0, dtype=torch.int64, device=device)
        # A request without a cached prefix gets SGLang's one empty CPU tensor: never read, but the
        # kernel's plan wants every prefix on the table's device.
        prefixes = [t if t.numel() or t.device == device else empty_prefix[device] for t in prefix_tensors]
        if (
            type(req_to_token_pool).write is not table_write
            or table.dtype != torch.int32
            or out_cache_loc.dtype != torch.int64
            or any(t.dtype != torch.int64 for t in prefixes)
        ):
            return sglang_write_cache_indices(
                out_cache_loc, req_pool_indices_tensor, req_pool_indices_cpu, prefix_lens_tensor, prefix_lens_cpu,
                seq_lens_tensor, seq_lens_cpu, extend_lens_tensor, extend_lens_cpu, prefix_tensors,
                req_to_token_pool)
        pinstage_write_cache_indices(table, req_pool_indices_cpu, prefixes, prefix_lens_cpu, seq_lens_cpu,
                                     extend_lens_cpu, out_cache_loc)
        return None

    return write_cache_indices

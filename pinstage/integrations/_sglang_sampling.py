"""SamplingBatchInfo.from_schedule_batch and its row-index helper on pinstage (SGLang 0.5.23).

SGLang builds the four or five per-request sampling tensors with one pinned tensor and one copy
each, and derives its flags with seven passes over the requests. Here the values are gathered once,
staged in ONE stage_many (one ring region, one copy), and the flags come from min/max/count over
the gathered values; the result is field for field what SGLang builds. Batches that use SGLang's
rarer per-request features (logit bias, custom logit processors, sampling masks, watermarks) are
handed to SGLang's own method, whose row indices still go through pinstage's helper below.
"""

import operator

import torch

import pinstage
from pinstage.builders.sampling import DEFAULT_SAMPLING_SEED, sampling_flags

_SAMPLING_VALUES = operator.attrgetter("temperature", "top_p", "top_k", "min_p")
_PARAMS = operator.attrgetter("sampling_params")
_MASK = operator.attrgetter("return_sampling_mask")
_BIAS = operator.attrgetter("logit_bias")
_SEED = operator.attrgetter("sampling_seed")
_NPU_TOP_K_MAX = 1024  # SGLang's bound for its NPU top-k/top-p kernel


def rows_to_device_indices(rows, device, pin=None):
    """int64 [len(rows)] on `device`: SGLang's _rows_to_device_indices (pin is SGLang's choice of
    pinned memory, which pinstage's ring makes moot)."""
    return pinstage.stage_to_device(rows, torch.int64, device=device)


def make_from_schedule_batch(sglang_from_schedule_batch, module):
    """The classmethod to install; `sglang_from_schedule_batch` is SGLang's function (cls, batch,
    vocab_size), `module` its module (for the runtime settings and penalty classes it reads)."""

    def from_schedule_batch(cls, batch, vocab_size):
        reqs = batch.reqs
        n = len(reqs)
        settings = module.get_exec()
        features = settings.features
        params = list(map(_PARAMS, reqs))
        masks = list(map(_MASK, reqs))
        if (
            any(masks)
            or features.enable_watermark
            or list(map(_BIAS, params)).count(None) != n
            or (features.enable_custom_logit_processor and any(r.custom_logit_processor for r in reqs))
        ):
            return sglang_from_schedule_batch(cls, batch, vocab_size)

        temperatures, top_ps, top_ks, min_ps = zip(*map(_SAMPLING_VALUES, params)) if n else ((), (), (), ())
        items = [(temperatures, torch.float32), (top_ps, torch.float32), (top_ks, torch.int32), (min_ps, torch.float32)]
        deterministic = settings.deterministic.enable_deterministic_inference
        if deterministic:
            items.append(([DEFAULT_SAMPLING_SEED if s is None else s for s in map(_SEED, params)], torch.int64))
        staged = pinstage.stage_many(items, device=batch.device)

        # SGLang's verify() keeps top_p and min_p in range and NaN out, so the builders' bound rule
        # gives its any/all flags.
        k_min, k_max = (min(top_ks), max(top_ks)) if n else (None, None)
        all_greedy, need_top_p, need_top_k, need_min_p = (
            sampling_flags(min(top_ps), k_min, k_max, max(min_ps)) if n else (True, False, False, False)
        )
        penalties = module.penaltylib
        info = cls(
            temperatures=staged[0].view(-1, 1),
            top_ps=staged[1],
            top_ks=staged[2],
            min_ps=staged[3],
            sampling_seed=staged[4] if deterministic else None,
            is_all_greedy=all_greedy,
            is_any_greedy=bool(n) and k_min <= 1,
            need_top_p_sampling=need_top_p,
            need_top_k_sampling=need_top_k,
            need_min_p_sampling=need_min_p,
            npu_top_k_top_p_eligible=not n or (k_min >= 1 and k_max <= _NPU_TOP_K_MAX),
            max_top_k=k_max if n and k_min >= 1 and k_max < module.TOP_K_ALL else None,
            vocab_size=vocab_size,
            penalizer_orchestrator=penalties.BatchedPenalizerOrchestrator(
                vocab_size=vocab_size,
                batch=batch,
                penalizers={
                    penalties.BatchedFrequencyPenalizer,
                    penalties.BatchedMinNewTokensPenalizer,
                    penalties.BatchedPresencePenalizer,
                    penalties.BatchedRepetitionPenalizer,
                },
            ),
            has_custom_logit_processor=False,
            device=batch.device,
            # No request asks for a sampling mask: SGLang's lists hold each request's (false) flag.
            return_sampling_masks=masks,
            return_sampling_support_logprobs=list(masks),
            sampling_mask_top_ks=[1] * n,
        )
        info.adjusted_from_schedule_batch(batch, vocab_size)
        return info

    return classmethod(from_schedule_batch)

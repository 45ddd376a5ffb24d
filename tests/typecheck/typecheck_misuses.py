"""Each call is a misuse mypy must report (the same ones raise TypeError at run time, see
test_builders_types): .ci/run's mypy fails on an unused `type: ignore`, so a misuse it stops
flagging fails CI."""

from pinstage.builders import BatchState, Request, SamplingParams, build_decode_inputs, build_sampling_batch

requests = [Request([1])]
BatchState().add(SamplingParams())  # type: ignore[arg-type]
build_sampling_batch(requests)  # type: ignore[arg-type]
build_decode_inputs(requests[0])  # type: ignore[arg-type]
Request([1], sampling_params=None)  # type: ignore[arg-type]

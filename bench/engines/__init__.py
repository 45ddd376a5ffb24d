"""SGLang's and vLLM's released Python source, loaded for the code that runs it: the integration
tests and the host-time benchmarks (bench/sglang_host.py, bench/vllm_host.py). source.py finds or
fetches the source; sglang_stubs.py and vllm_stubs.py import it with the engines' heavy
dependencies stood in."""

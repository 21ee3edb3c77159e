"""The CPU test bed behind `vllm-cpp demo` and `vllm-cpp serve-model`; not the plugin.

A tiny dummy-weight Llama and the vLLM arguments and environment that run it with pipeline
parallel size 2 on a CPU machine. The plugin never imports this package; the tests and
benchmarks build on it (their server and client helpers live in `tests/serving.py`).
"""

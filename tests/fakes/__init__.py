"""Stand-ins for software that cannot run on this machine (NPU, CANN, torch-npu, vllm-ascend).

Each fake mirrors the real signatures of one release, named in its docstring; bodies are ours.
"""

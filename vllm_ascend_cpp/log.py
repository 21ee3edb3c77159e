"""The plugin's logger: a child of vLLM's "vllm" logger, so vLLM's handlers and format apply
(and no vLLM import is needed to get it). Every message starts with "[CPP]"."""

import logging

logger = logging.getLogger("vllm.vllm_ascend_cpp")

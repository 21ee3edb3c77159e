"""Code that runs inside vLLM worker processes: the startup sweep and the step timer."""

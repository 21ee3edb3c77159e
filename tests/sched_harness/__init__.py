"""vLLM's own scheduler in the loop: the plugin's scheduler classes built on vLLM 0.32's
`Scheduler` / `AsyncScheduler` with a real KV cache manager and no workers, driven through
random traffic (see drive.py for what is checked on every step)."""

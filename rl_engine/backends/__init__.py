"""Heavy engine backends (vLLM rollout, DeepSpeed training). Each module imports its engine lazily, so
importing `rl_engine` never imports vllm or deepspeed."""

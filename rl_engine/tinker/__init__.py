"""A Tinker-compatible training service: the official ``tinker`` SDK drives LoRA training and sampling here.

``python -m rl_engine.tinker serve --model NAME=FOLDER --api-key-file FILE`` serves the API the SDK calls
(:mod:`rl_engine.tinker.server`); the state and the queue are :mod:`rl_engine.tinker.service`'s, the compute
:mod:`rl_engine.tinker.model`'s and the losses :mod:`rl_engine.tinker.losses`'. docs/TINKER.md says how to
point a Tinker script at it.
"""

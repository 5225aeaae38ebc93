"""Scripts the probe runs in child interpreters (they import torch/triton/vllm).

Each prints one JSON object as the last line of stdout. They are never
imported by the probe itself.
"""

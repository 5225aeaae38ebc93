"""Developer tools (benchmarks, rule checks, interop) behind the same CLI registry."""

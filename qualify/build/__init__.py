"""Stage 1, build: engine, hermetic base, wheelhouses and locks, image builds, the loopback registry."""

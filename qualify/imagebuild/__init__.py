"""Stage 1, build: hermetic base, root file systems, wheelhouses and locks, base pins, image builds and their build cache."""

"""Stage 4, release: verify, sign and tag a release; SHA256SUMS; show/diff reports."""

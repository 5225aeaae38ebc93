"""Stage 3, sign: key formats, the built-in signer, cosign through subprocess."""

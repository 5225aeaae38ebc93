"""Stage 5, deploy: the trust gate, the compose project, the health wait and canary."""

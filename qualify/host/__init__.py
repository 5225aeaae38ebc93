"""The platform layer every host-side stage stands on.

The one engine class and its push progress, the loopback registry and the
skopeo client, external commands, state and record paths, provenance, the
ledger of what this checkout made and taking it away, and text tables.
"""

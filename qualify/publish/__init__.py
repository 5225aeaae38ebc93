"""6. publish: release images copied by digest to a real registry, with their
attestations (DSSE envelopes, cosign's layout) beside them, verified from there."""

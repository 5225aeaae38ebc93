"""The targets file (images/targets.toml) loaded into typed data; image references; base pins."""

"""Inputs for engines beyond one machine, generated from images/targets.toml.

`bake` (docker buildx bake), `workflow` (GitHub Actions), `k8s` (a Job per
target on a GPU node) and `merge` (evidence from many hosts for `qualify
promote`). Nothing here builds, runs or schedules anything itself.
"""

"""Stage 2, qualify: run the probe in a container of the built image, write the manifest."""

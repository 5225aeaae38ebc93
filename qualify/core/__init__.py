"""Image side, part 1: what runs inside images (standard library and pyelftools only)."""

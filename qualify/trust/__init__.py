"""Trust: the one verifier of everything signed with the release key (a release folder, a tagged release, a
journal's view, the enrolled hosts) and its one writer, over bytes that sources hand over."""

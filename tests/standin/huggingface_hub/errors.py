"""TEST DOUBLE: the one error class of huggingface_hub.errors the deploy's config read catches."""


class EntryNotFoundError(Exception):
    pass

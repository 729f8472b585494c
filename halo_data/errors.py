"""The error every part of the lake raises for what a user can act on."""


class LakeError(Exception):
    """An error a user can act on; the CLI prints it as one ``Error: ...`` line."""

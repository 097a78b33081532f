"""The one error the converter raises for bad input: its message names the tensor or file."""


class ReleaseError(ValueError):
    pass

"""Errors that cross layers."""


class EngineDead(Exception):
    """A rank died, stopped answering or failed a step: every in-flight request ends with
    finish_reason "error", /health turns 503, the server shuts its ranks down."""


class MeshStartError(Exception):
    """A rank could not start (bad checkpoint, topology, out of memory ...)."""

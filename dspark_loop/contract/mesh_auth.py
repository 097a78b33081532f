"""Who may join the rank mesh: a shared secret, proven with HMAC-SHA256 over fresh nonces.

    peer (rank or node agent, DEALER)                 server (node 0, ROUTER)
      Knock(client_nonce)  ---------------------->    picks server_nonce for this peer
                           <----------------------    Challenge(client_nonce, server_nonce,
                                                                proof = server_proof(...))
      checks the proof (the server knows the secret)
      Hello / NodeHello, mac = client_proof(server_nonce, the message with mac=b"")
                           ---------------------->    checks the mac; the peer is admitted

Both nonces are fresh per attempt, so a recorded Hello cannot be replayed, and neither side
ever sends the secret. The secret comes from DSPARK_MESH_SECRET (the same value on every
node); a run on one host that does not set it gets one generated for the run, which reaches
its ranks through their environment (never their command line, which `ps` shows).
Authentication only: frames are not encrypted (docs/deployment.md). Torch-free.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

import msgspec

from dspark_loop.contract.protocol import ENCODER

SECRET_ENV = "DSPARK_MESH_SECRET"
MIN_SECRET_LEN = 16  # characters
NONCE_BYTES = 16
_SERVER_TAG = b"dspark-mesh server\0"
_CLIENT_TAG = b"dspark-mesh client\0"


class SecretError(ValueError):
    """DSPARK_MESH_SECRET is missing where it is required, or too short."""


def resolve_secret(nnodes: int, environ: dict[str, str] | None = None) -> tuple[str, bool]:
    """(secret, generated): the environment's secret, or a fresh one for a one-host run."""
    env = os.environ if environ is None else environ
    secret = env.get(SECRET_ENV, "")
    if secret:
        if len(secret) < MIN_SECRET_LEN:
            raise SecretError(
                f"{SECRET_ENV} must be at least {MIN_SECRET_LEN} characters "
                f"(got {len(secret)}); e.g. "
                f"{SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        return secret, False
    if nnodes > 1:
        raise SecretError(
            f"{SECRET_ENV} must be set, to the same value on every node, with "
            f"--nnodes {nnodes}: it authenticates the nodes' ranks; e.g. "
            f"export {SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secrets.token_hex(32), True


def secret_from_env(environ: dict[str, str] | None = None) -> str:
    """A spawned process's secret (rank or agent): its spawner always sets it."""
    env = os.environ if environ is None else environ
    secret = env.get(SECRET_ENV, "")
    if not secret:
        raise SecretError(f"{SECRET_ENV} is not set: a rank needs the secret of the mesh it joins")
    return secret


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(secret: str, *parts: bytes) -> bytes:
    return hmac.new(secret.encode(), b"".join(parts), hashlib.sha256).digest()


def server_proof(secret: str, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The server's answer to a Knock: shows it knows the secret (the peer checks it)."""
    return _mac(secret, _SERVER_TAG, client_nonce, server_nonce)


def client_proof(secret: str, server_nonce: bytes, body: bytes) -> bytes:
    """A peer's mac over its Hello (encoded with mac=b"") and the server's nonce."""
    return _mac(secret, _CLIENT_TAG, server_nonce, body)


def same(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison (a timing side channel must not leak the mac)."""
    return hmac.compare_digest(expected, got)


def sign(msg, secret: str, server_nonce: bytes):
    """msg (a Hello or NodeHello) with its mac set over its encoding with mac=b""."""
    body = ENCODER.encode(msgspec.structs.replace(msg, mac=b""))
    return msgspec.structs.replace(msg, mac=client_proof(secret, server_nonce, body))


def is_signed(msg, secret: str, server_nonce: bytes) -> bool:
    return same(sign(msg, secret, server_nonce).mac, msg.mac)

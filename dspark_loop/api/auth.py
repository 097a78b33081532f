"""API keys: `Authorization: Bearer KEY` on the routes that use the model.

    /v1/*, /tokenize, /detokenize      need a key (when the server was given any)
    /health, /metrics*, /openapi.json  open, as vLLM leaves them (probes and scrapers)
    /version, /server_info, /loads ... open for routers (server_info.py), unless
                                       --protect-router-info puts them behind the key

A missing or wrong key is a 401 in OpenAI's shape (type invalid_request_error, code
invalid_api_key) with a WWW-Authenticate challenge (RFC 6750). The presented key is
compared with every configured key, always all of them, as SHA-256 digests through
hmac.compare_digest: the time taken says neither which key nor how much of one matched.
Nothing here logs or echoes a key.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from dspark_loop.api.errors import ApiError
from dspark_loop.api.server_info import ROUTER_INFO_PATHS

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


def needs_key(path: str, protect_router_info: bool = False) -> bool:
    if path in ROUTER_INFO_PATHS:
        return protect_router_info
    return path.startswith(PROTECTED_PREFIXES)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class KeyCheck:
    def __init__(self, keys):
        self._digests = [_digest(k) for k in keys]

    def matches(self, presented: str) -> bool:
        given = _digest(presented)
        ok = False
        for d in self._digests:  # NOTE: no early exit: every key costs the same compare
            ok |= hmac.compare_digest(given, d)
        return ok


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def unauthorized(presented: bool) -> ApiError:
    if presented:
        message, challenge = ("Incorrect API key provided.", 'Bearer realm="dspark_loop", error="invalid_token"')
    else:
        message, challenge = (
            "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
            'Bearer realm="dspark_loop"',
        )
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": challenge})


def api_key_middleware(keys, protect_router_info: bool = False):
    """An aiohttp middleware requiring one of `keys`; None when there are no keys."""
    if not keys:
        return None
    check = KeyCheck(keys)

    @web.middleware
    async def require_api_key(request: web.Request, handler):
        if needs_key(request.path, protect_router_info):
            token = bearer_token(request.headers.get("Authorization"))
            if token is None or not check.matches(token):
                return unauthorized(token is not None or "Authorization" in request.headers).response()
        return await handler(request)

    return require_api_key

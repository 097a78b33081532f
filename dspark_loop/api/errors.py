"""ApiError: a failed request as data, rendered as OpenAI's error body.

    {"error": {"message": ..., "type": "invalid_request_error", "param": "max_tokens",
               "code": "invalid_value"}}

4xx for what the client sent (never 500 for user input), 503 while the engine is not
ready or dead, 500 only for an engine failure or a bug: a bug's answer names a request id
(also in the X-Request-Id header) and the server logs the traceback under it; the
exception's text stays in the log, never in the answer.
"""

from __future__ import annotations

import logging
import uuid

from aiohttp import web

log = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


RETRY_AFTER_S = 1  # what a 503 that will pass (starting, restarting, overloaded) asks a client to wait


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers  # e.g. Retry-After, WWW-Authenticate

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_parameter")


def not_ready() -> ApiError:
    """Before the ranks are up (weights loading): every model route, /v1/models included.
    NOTE: /v1/models too: a client that polls it until 200 and then sends (a common start-up
    script) got this 503 for its first request while the ranks still loaded. smg reads
    /v1/models only after /health answers 200, so routers are not affected."""
    return ApiError(503, "The engine is not ready yet; retry shortly.", code="engine_not_ready", headers=retry_after())


def context_length_exceeded(prompt_len: int, limit: int) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens; "
        f"it must be shorter than {limit} to leave room for at least one output token.",
        param="prompt",
        code="context_length_exceeded",
    )


def retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


@web.middleware
async def error_middleware(request: web.Request, handler):
    """ApiError -> its JSON body; aiohttp's own 4xx (404 route, 405 method) -> the same shape."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status >= 400 and e.content_type != "application/json":
            # NOTE: the rewrite keeps aiohttp's Allow header: a 405 must list the methods (RFC 9110)
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            return ApiError(
                e.status,
                e.reason or e.text or "error",
                code=e.reason.lower().replace(" ", "_") if e.reason else None,
                headers=allow,
            ).response()
        raise
    except ConnectionResetError:
        raise  # the client is gone; nobody to answer
    except Exception:  # a bug: answer in the OpenAI shape and keep serving
        request_id = f"err-{uuid.uuid4().hex}"
        log.exception("unhandled error in %s %s (request id %s)", request.method, request.path, request_id)
        return ApiError(
            500,
            f"Internal server error (request id {request_id}); the server log has the details.",
            code="internal_error",
            headers={"X-Request-Id": request_id},
        ).response()

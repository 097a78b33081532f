"""A msgspec bound violation (a field's Meta ge/gt/le/lt or length) -> the 400 that names
the field and its whole range, e.g. "`top_p` must be in (0, 1], got 0."

msgspec reports only the side that failed ("Expected `float` > 0.0 - at `$.top_p`"); the
range is read back from the struct's own Meta, so the message and the bound are one fact.
"""

from __future__ import annotations

import re

import msgspec

from dspark_loop.api.errors import ApiError, bad_request, unsupported

_BOUND = re.compile(r"^Expected `\w+` (?:>=|>|<=|<) \S+ - at `\$\.(\w+)([^`]*)`$")
_LENGTH = re.compile(r"^Expected `\w+` of length (>=|<=) (\d+) - at `\$\.(\w+)([^`]*)`$")


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _numeric_info(kind: type, field: str):
    """The Int/FloatType (with its bounds) of a top-level field of the struct `kind`."""
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType), kind
    for f in info.fields:
        if f.name != field:
            continue
        types = f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)
        for t in types:
            if isinstance(t, msgspec.inspect.Metadata):  # a titled or documented field: its own type
                t = t.type
            if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
                return t
    return None


def _range_text(t) -> str:
    lo = (t.ge, "[") if t.ge is not None else (t.gt, "(")
    hi = (t.le, "]") if t.le is not None else (t.lt, ")")
    if lo[0] is not None and hi[0] is not None:
        return f"in {lo[1]}{_num(lo[0])}, {_num(hi[0])}{hi[1]}"
    if lo[0] is not None:
        if t.gt is not None:
            return f"> {_num(lo[0])}"
        return f">= {_num(lo[0])}" if isinstance(t, msgspec.inspect.FloatType) else f"at least {lo[0]}"
    return f"at most {_num(hi[0])}" if t.le is not None else f"< {_num(hi[0])}"


def _value(body: bytes, field: str):
    try:
        return msgspec.json.decode(body).get(field)
    except (msgspec.DecodeError, AttributeError):
        return None


def bound_error(kind: type, message: str, body: bytes) -> ApiError | None:
    """The 400 for msgspec's `message` if it is a bound violation, else None."""
    if m := _LENGTH.match(message):
        op, limit, field, rest = m.groups()
        where = field + rest
        if op == "<=" and limit == "0":
            return unsupported(field, f"`{field}` is not supported by this server.")
        if op == ">=" and limit == "1":
            return bad_request(f"`{where}` must not be empty.", field)
        return bad_request(f"`{where}` must have length {op} {limit}.", field)
    if m := _BOUND.match(message):
        field, rest = m.groups()
        info = _numeric_info(kind, field) if not rest else None
        if info is None:  # inside a list (token ids): msgspec's own words
            return bad_request(f"`{field + rest}`: {message[: message.index(' - at ')]}.", field)
        return bad_request(f"`{field}` must be {_range_text(info)}, got {_value(body, field)}.", field)
    return None

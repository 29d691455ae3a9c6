"""Errors the user can act on.

Every error raised for bad input is a ``SpecctlError`` whose message names the offending value and
what would be accepted. The CLI prints it as one line (no traceback) and exits non-zero; the service
turns it into a 4xx; the Triton model into a request error.
"""

from __future__ import annotations


class SpecctlError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_code = 2


class ConfigError(SpecctlError):
    """A profile, plan, recipe or option that does not validate."""


class MissingDependencyError(SpecctlError):
    """An optional component (TensorRT-LLM, a GPU, tritonserver) is not available here."""

    exit_code = 3


def describe_validation_error(what: str, err: Exception) -> str:
    """One line from a pydantic ValidationError: the first failing field, its value and the rule."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            first = items[0]
            if first.get("type") == "json_invalid":  # FastAPI: loc (body, offset); pydantic: loc ()
                why = (first.get("ctx") or {}).get("error", "JSON decode error")
                at = [p for p in first.get("loc", ()) if isinstance(p, int)]
                where = f" at offset {at[-1]}" if at else ""
                return f"{what}: not valid JSON ({why}{where})"
            loc = ".".join(str(p) for p in first.get("loc", ())) or "<root>"
            msg = str(first.get("msg", err)).removeprefix("Value error, ")
            value = first.get("input")
            shown = repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            more = f" (and {len(items) - 1} more problem(s))" if len(items) > 1 else ""
            return f"{what}: field '{loc}' = {shown}: {msg}{more}"
    return f"{what}: {err}"

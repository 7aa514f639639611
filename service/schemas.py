"""Request bodies of the reference service, and how bad ones are answered.

Bodies are read with a size limit (``max_body_bytes``: 413 past it), parsed and validated with
pydantic: a ``Content-Type`` other than JSON is a 415 (no header is taken as JSON), invalid JSON a
400, a well-formed body of the wrong shape or types a 422. Types are strict: ``true`` is not 1,
``"8"`` is not 8, ``1.5`` is not an integer, ``NaN``/``Infinity``/``1e999`` are not inputs. Error answers
name the offending field and the rule it broke, never echo the submitted values (a prompt must not
travel into logs through an error message).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["BadRequest", "GenerateRequest", "PredictRequest", "parse_body", "read_body"]

M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    """A 4xx answer: ``status`` and a JSON-able ``detail``."""

    def __init__(self, status: int, error: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.details = details or []

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.error}
        if self.details:
            out["details"] = self.details
        return out


class PredictRequest(BaseModel):
    """``POST /v1/predict``: the model input, and optionally which entity's features to read."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    inputs: list[float] = Field(default_factory=list, max_length=4096)
    entity_id: int | None = Field(default=None, ge=0, le=2**63 - 1)


class GenerateRequest(BaseModel):
    """``POST /v1/generate``: prompt text (one token per whitespace-separated word)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    prompt: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = True


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or :class:`BadRequest` 413 as soon as it exceeds ``limit`` bytes (415 when
    the ``Content-Type`` says it is not JSON)."""
    ctype = request.headers.get("content-type")
    if ctype is not None and not _is_json(ctype):
        raise BadRequest(415, f"Content-Type must be application/json, got {ctype.split(';')[0].strip()[:80]!r}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BadRequest(415, f"Content-Encoding {encoding[:40]!r} is not supported; send the JSON uncompressed")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BadRequest(413, f"request body larger than {limit} bytes")
        except ValueError:
            raise BadRequest(400, "bad Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_body(model: type[M], raw: bytes) -> M:
    """Validate ``raw`` JSON against ``model``: 400 for invalid JSON, 422 for a wrong shape or type."""
    if not raw.strip():
        raise BadRequest(400, "empty request body: expected a JSON object")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        if any(e.get("type") == "json_invalid" for e in errors):
            return _raise_json(errors)
        details = [
            {"field": ".".join(str(p) for p in e.get("loc", ())) or "(body)", "error": str(e.get("msg", ""))}
            for e in errors
        ]
        raise BadRequest(422, "invalid request body", details) from None


def _raise_json(errors: list[Any]) -> Any:
    msg = next((str(e.get("msg")) for e in errors if e.get("type") == "json_invalid"), "invalid JSON")
    raise BadRequest(400, f"request body is not valid JSON ({msg})")

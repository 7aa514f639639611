"""Load for OpenAI-compatible servers: ``--api openai-completions`` and ``--api openai-chat``.

vLLM (``vllm serve``), SGLang, llama.cpp's ``llama-server`` and Hugging Face TGI all serve the OpenAI
streaming APIs ``POST /v1/completions`` and ``POST /v1/chat/completions``. With ``--api`` the load
generator sends, per request of the schedule::

    /v1/completions       {"model": M, "prompt": P, "max_tokens": N, "stream": true,
                           "stream_options": {"include_usage": true}}
    /v1/chat/completions  {"model": M, "messages": [{"role": "user", "content": P}], "max_tokens": N,
                           "stream": true, "stream_options": {"include_usage": true}}

where P is a synthetic prompt of the request's prompt length (:mod:`stagescope.loadgen.bodies`) and
N its output length (``max_tokens``: every one of these servers accepts it on both endpoints;
OpenAI's newer ``max_completion_tokens`` is not read by all of them). ``model`` is ``--model``, else
the first id ``GET /v1/models`` lists (all four serve it), else left out. ``--body FILE`` replaces the
body (:mod:`stagescope.loadgen.template`, e.g. to add ``ignore_eos``); the response is still read as
an OpenAI stream (:class:`~stagescope.loadgen.streams.OpenAIStream`).

``--url`` may be the server (``http://host:8000``), the base URL an OpenAI client takes
(``http://host:8000/v1``) or the endpoint itself (``http://host:8000/v1/chat/completions``). A URL or
``--route`` ending in ``/chat/completions`` or ``/completions`` selects the API without ``--api``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from stagescope.errors import UserError
from stagescope.loadgen.template import BodyTemplate

__all__ = ["APIS", "API_PATHS", "default_template", "discover_model", "endpoint_path", "infer_api"]

#: ``--api`` values (besides the default, the reference service's routes).
APIS: tuple[str, ...] = ("openai-completions", "openai-chat")
#: The path suffix each API is served under.
API_PATHS: dict[str, str] = {"openai-completions": "/completions", "openai-chat": "/chat/completions"}


def infer_api(path: str) -> str | None:
    """The API a request path is the endpoint of (``.../chat/completions``, ``.../completions``), if any."""
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith(API_PATHS["openai-chat"]):
        return "openai-chat"
    if p.endswith(API_PATHS["openai-completions"]):
        return "openai-completions"
    return None


def endpoint_path(url_path: str, api: str) -> str:
    """The request path for ``api`` given the path of ``--url``: the endpoint itself when the URL names
    it, else the URL's path as the OpenAI base URL (``/v1`` when it has none) plus the API's suffix."""
    p = url_path.rstrip("/")
    named = infer_api(p)
    if named == api:
        return p
    if named is not None:
        raise UserError(f"the URL's path {p} is the {named} endpoint, not {api}'s ({API_PATHS[api]})")
    return (p or "/v1") + API_PATHS[api]


def default_template(api: str, model: str | None) -> BodyTemplate:
    """The streaming request body of ``api`` (see the module docstring) as a template."""
    body: dict[str, Any] = {} if model is None else {"model": model}
    if api == "openai-chat":
        body["messages"] = [{"role": "user", "content": "{{prompt}}"}]
    else:
        body["prompt"] = "{{prompt}}"
    body.update(max_tokens="{{output_tokens}}", stream=True, stream_options={"include_usage": True})
    return BodyTemplate(body, source=f"--api {api}")


def _get_models(url: str, headers: dict[str, str], timeout_s: float) -> str | None:
    req = urllib.request.Request(url, headers={k: v for k, v in headers.items() if k.lower() != "content-type"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = json.loads(resp.read(1 << 20))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
        return str(data[0]["id"])
    return None


async def discover_model(
    origin: str, endpoint: str, api: str, headers: dict[str, str], timeout_s: float = 3.0
) -> str | None:
    """The first model ``GET <base>/models`` lists (``<base>``: ``endpoint`` without the API's suffix),
    or None when the server does not answer that. Runs before the load starts."""
    base = endpoint.split("?", 1)[0].rstrip("/")[: -len(API_PATHS[api])]
    return await asyncio.to_thread(_get_models, f"{origin}{base}/models", headers, timeout_s)

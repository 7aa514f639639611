"""The model the llama.cpp engine serves: a RANDOM-WEIGHT llama written here with the ``gguf`` package.

Real compute, meaningless text. The file has a real llama architecture (``RECIPE``: 4 layers, 256 wide,
4 attention heads, a SwiGLU feed-forward of 768) whose every weight is drawn from a seeded normal
distribution (std 0.02; the RMS-norm gains are 1), and a real tokenizer: every ``tokenizer.*`` field
of ``ggml-vocab-llama-spm.gguf``, the vocabulary-only GGUF (no weights) that llama.cpp ships under
``models/`` in the same source tree the server is built from (32,000 SentencePiece tokens). So
``llama-server`` tokenizes prompts exactly as it would for a llama model and runs the same matrix
work per prompt and generated token as a trained model of that shape, while what it generates is
noise. Nothing is downloaded: the vocabulary comes from the build's cache entry
(:mod:`stagescope.service.llama_cpp.build`).

The file is cached in ``$STAGESCOPE_CACHE_DIR/llama.cpp-model/<key>/`` (default
``~/.cache/stagescope``), ``<key>`` hashing the recipe, the vocabulary file's SHA-256 and the
``gguf`` version, beside a ``manifest.json`` saying how it was made. About 80 MB (float32).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stagescope.errors import UserError
from stagescope.service.llama_cpp.build import cache_root

__all__ = ["MODEL_FILE", "RECIPE", "ModelArtifact", "ensure_model", "model_key", "write_model"]

#: How the model is made. Any change makes a new cache entry.
RECIPE: Mapping[str, Any] = MappingProxyType(
    {
        "architecture": "llama",
        "n_layer": 4,
        "n_embd": 256,
        "n_head": 4,
        "n_head_kv": 4,
        "n_ff": 768,
        "context_length": 8192,
        "rms_norm_eps": 1e-5,
        "rope_freq_base": 10000.0,
        "init_std": 0.02,
        "seed": 20240917,
        "dtype": "float32",
        "recipe_version": 1,
    }
)
#: The file name says what it is wherever it appears (server logs, reports).
MODEL_FILE = "stagescope-random-weights-llama-4x256-f32.gguf"
#: ``general.name`` in the file (llama.cpp lists it under ``/v1/models``' metadata and logs it).
MODEL_NAME = "stagescope random-weight llama 4x256 (real compute, meaningless text)"


@dataclass(frozen=True)
class ModelArtifact:
    """A written model: the folder, the GGUF file and its manifest."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def path(self) -> Path:
        return self.folder / MODEL_FILE


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"


def model_key(vocab: Path, recipe: Mapping[str, Any] = RECIPE) -> str:
    """12 hex digits naming one model: the recipe, the vocabulary file's bytes, the gguf version."""
    doc = json.dumps({**recipe, "vocab_sha256": _sha256(vocab), "gguf": _gguf_version()}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:12]


def _tensor_shapes(r: Mapping[str, Any], n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy shape (rows, cols) of llama.cpp's llama layout (ggml's ``ne`` reversed)."""
    e, ff, kv = int(r["n_embd"]), int(r["n_ff"]), int(r["n_embd"]) // int(r["n_head"]) * int(r["n_head_kv"])
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, e),
        "output_norm.weight": (e,),
        "output.weight": (n_vocab, e),
    }
    for i in range(int(r["n_layer"])):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (e,),
            f"blk.{i}.attn_q.weight": (e, e),
            f"blk.{i}.attn_k.weight": (kv, e),
            f"blk.{i}.attn_v.weight": (kv, e),
            f"blk.{i}.attn_output.weight": (e, e),
            f"blk.{i}.ffn_norm.weight": (e,),
            f"blk.{i}.ffn_gate.weight": (ff, e),
            f"blk.{i}.ffn_up.weight": (ff, e),
            f"blk.{i}.ffn_down.weight": (e, ff),
        })  # fmt: skip
    return shapes


def _copy_tokenizer(reader: Any, writer: Any) -> int:
    """Every ``tokenizer.*`` field of the vocab file into the writer; returns the vocabulary size."""
    from gguf import GGUFValueType

    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(name, value, vtype, sub)
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if not n_vocab:
        raise UserError("the vocabulary file has no tokenizer.ggml.tokens")
    return n_vocab


def write_model(path: Path, vocab: Path, recipe: Mapping[str, Any] = RECIPE) -> dict[str, Any]:
    """Write the random-weight llama of ``recipe`` with ``vocab``'s tokenizer to ``path``; returns
    what the manifest records about the file (vocabulary size, parameter count, bytes)."""
    import numpy as np
    from gguf import GGUFReader, GGUFWriter, LlamaFileType

    r = recipe
    reader = GGUFReader(str(vocab))
    writer = GGUFWriter(str(path), str(r["architecture"]))
    writer.add_name(MODEL_NAME)
    writer.add_description("RANDOM WEIGHTS written by stagescope: real compute, meaningless text")
    writer.add_context_length(int(r["context_length"]))
    writer.add_embedding_length(int(r["n_embd"]))
    writer.add_block_count(int(r["n_layer"]))
    writer.add_feed_forward_length(int(r["n_ff"]))
    writer.add_head_count(int(r["n_head"]))
    writer.add_head_count_kv(int(r["n_head_kv"]))
    writer.add_rope_dimension_count(int(r["n_embd"]) // int(r["n_head"]))
    writer.add_rope_freq_base(float(r["rope_freq_base"]))
    writer.add_layer_norm_rms_eps(float(r["rms_norm_eps"]))
    writer.add_file_type(LlamaFileType.ALL_F32)
    n_vocab = _copy_tokenizer(reader, writer)
    writer.add_vocab_size(n_vocab)
    rng = np.random.default_rng(int(r["seed"]))
    params = 0
    for name, shape in _tensor_shapes(r, n_vocab).items():
        if len(shape) == 1:  # RMS-norm gains
            arr = np.ones(shape, dtype=np.float32)
        else:
            arr = rng.normal(0.0, float(r["init_std"]), size=shape).astype(np.float32)
        params += arr.size
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"n_vocab": n_vocab, "parameters": int(params), "bytes": path.stat().st_size}


def ensure_model(vocab: Path, root: Path | None = None, recipe: Mapping[str, Any] | None = None) -> ModelArtifact:
    """The cached model for ``recipe`` (default :data:`RECIPE`) and ``vocab``, written first when absent
    (seconds)."""
    recipe = RECIPE if recipe is None else recipe
    if not vocab.is_file():
        raise UserError(f"{vocab}: the vocabulary GGUF is missing (rebuild: python -m stagescope.service.llama_cpp.build)")
    key = model_key(vocab, recipe)
    folder = (root or cache_root()) / "llama.cpp-model" / key
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads((folder / "manifest.json").read_text())
        if (folder / MODEL_FILE).stat().st_size == manifest["file"]["bytes"]:
            return ModelArtifact(folder, manifest)
    tmp = folder.with_name(f".{key}-{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        info = write_model(tmp / MODEL_FILE, vocab, recipe)
        manifest = {
            "what": "RANDOM-WEIGHT llama model: real compute, meaningless text (not a trained model)",
            "file": {"name": MODEL_FILE, **info, "sha256": _sha256(tmp / MODEL_FILE)},
            "recipe": dict(recipe),
            "weights": f"normal(0, {recipe['init_std']}) float32 from numpy default_rng({recipe['seed']}); "
                       "RMS-norm gains 1",
            "tokenizer": {"from": vocab.name, "sha256": _sha256(vocab),
                          "source": "llama.cpp's models/ folder in the llama-cpp-python sdist (vocab only)"},
            "written_by": "stagescope.service.llama_cpp.gguf_model.write_model with the gguf package "
                          f"{_gguf_version()}",
            "write_seconds": round(time.monotonic() - t0, 2),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key": key,
        }  # fmt: skip
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if folder.exists():
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
        tmp.rename(folder)
    except OSError as exc:
        raise UserError(f"cannot write the llama.cpp model under {folder.parent}: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            for p in tmp.iterdir():
                p.unlink()
            tmp.rmdir()
    return ModelArtifact(folder, manifest)

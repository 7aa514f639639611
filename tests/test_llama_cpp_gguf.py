"""The GGUF writer: a random-weight llama with a vocabulary copied from a vocab-only GGUF.

Read back with the ``gguf`` package's own reader: the architecture fields, every tensor's shape in
llama.cpp's layout, the tokenizer fields identical to the source's, the weights seeded (two writes are
byte-identical) and named as random everywhere. With the llama.cpp build present, the vocabulary is
the real one llama.cpp ships (32,000 tokens); without it, a small vocabulary written here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the llama-cpp extra (gguf) is not installed")

import gguf

from stagescope.service.llama_cpp import gguf_model as G
from stagescope.service.llama_cpp.build import find_server

SMALL = {**G.RECIPE, "n_layer": 2, "n_embd": 64, "n_head": 2, "n_head_kv": 1, "n_ff": 128}


def _small_vocab(path: Path, n: int = 300) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    tokens += [f"\u2581w{i}" for i in range(n - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(len(tokens))])
    w.add_token_types([2, 3, 3, *([6] * 256), *([1] * (len(tokens) - 259))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def _vocabs(tmp_path: Path) -> list[Path]:
    out = [_small_vocab(tmp_path / "vocab-small.gguf")]
    build = find_server()
    if build is not None:
        out.append(build.vocab())
    return out


def _field(reader: gguf.GGUFReader, name: str) -> object:
    return reader.fields[name].contents()


@pytest.mark.parametrize("which", [0, 1], ids=["small-vocab", "llama-cpp-vocab"])
def test_written_model_reads_back_as_a_llama(tmp_path: Path, which: int) -> None:
    vocabs = _vocabs(tmp_path)
    if which >= len(vocabs):
        pytest.skip("llama.cpp not built here (python -m stagescope.service.llama_cpp.build): its vocab is absent")
    vocab = vocabs[which]
    out = tmp_path / "m.gguf"
    info = G.write_model(out, vocab, SMALL)
    src, got = gguf.GGUFReader(str(vocab)), gguf.GGUFReader(str(out))
    assert _field(got, "general.architecture") == "llama"
    assert "random" in str(_field(got, "general.name")).lower()
    assert _field(got, "llama.block_count") == 2 and _field(got, "llama.embedding_length") == 64
    assert _field(got, "llama.attention.head_count_kv") == 1
    # every tokenizer field copied as it was
    tok = sorted(k for k in src.fields if k.startswith("tokenizer."))
    assert tok and tok == sorted(k for k in got.fields if k.startswith("tokenizer."))
    for k in tok:
        assert _field(got, k) == _field(src, k), k
    n_vocab = len(_field(src, "tokenizer.ggml.tokens"))  # type: ignore[arg-type]
    assert info["n_vocab"] == n_vocab
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in got.tensors}  # ggml order: ne0 first
    assert shapes["token_embd.weight"] == (64, n_vocab) and shapes["output.weight"] == (64, n_vocab)
    assert shapes["blk.1.attn_k.weight"] == (64, 32) and shapes["blk.0.ffn_down.weight"] == (128, 64)
    assert len(shapes) == 3 + 9 * 2
    emb = next(t for t in got.tensors if t.name == "token_embd.weight").data
    assert abs(float(emb.std()) - SMALL["init_std"]) < 0.002  # random normal(0, 0.02), not zeros


def test_model_is_cached_by_recipe_with_a_manifest(tmp_path: Path) -> None:
    vocab = _small_vocab(tmp_path / "v.gguf")
    art = G.ensure_model(vocab, root=tmp_path / "cache", recipe=SMALL)
    m = json.loads((art.folder / "manifest.json").read_text())
    assert "RANDOM" in m["what"] and m["tokenizer"]["from"] == "v.gguf" and m["recipe"]["n_embd"] == 64
    assert m["file"]["bytes"] == art.path.stat().st_size and "random" in art.path.name
    mtime = art.path.stat().st_mtime_ns
    again = G.ensure_model(vocab, root=tmp_path / "cache", recipe=SMALL)
    assert again.path == art.path and again.path.stat().st_mtime_ns == mtime  # found, not rewritten
    # the weights are seeded: a second write is byte-identical
    other = tmp_path / "again.gguf"
    G.write_model(other, vocab, SMALL)
    assert other.read_bytes() == art.path.read_bytes()
    # a damaged file is rewritten
    art.path.write_bytes(b"truncated")
    assert G.ensure_model(vocab, root=tmp_path / "cache", recipe=SMALL).path.stat().st_size == m["file"]["bytes"]
    # another recipe is another entry
    assert G.ensure_model(vocab, root=tmp_path / "cache", recipe={**SMALL, "seed": 1}).folder != art.folder


def test_missing_vocab_is_one_line(tmp_path: Path) -> None:
    from stagescope.errors import UserError

    with pytest.raises(UserError, match="vocabulary GGUF is missing"):
        G.ensure_model(tmp_path / "absent.gguf", root=tmp_path)

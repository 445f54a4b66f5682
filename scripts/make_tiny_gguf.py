#!/usr/bin/env python3
"""Write a tiny seeded random-weight llama GGUF that reuses a real model's tokenizer.

The file is a test fixture (STYLE.md section 7): small enough to load and decode in
milliseconds on a CPU, yet it tokenizes exactly like the real model, because every
`tokenizer.*` key (vocabulary, merges, token types, special ids, chat template) is copied
byte for byte from a real GGUF. The weights come from numpy's PCG64 generator seeded with
--seed, so the same seed always gives the same bytes and the same greedy outputs.

Weight scales are chosen so that greedy decoding depends on the whole context:
  - the output head is untied from the embedding (a tied head makes every token predict
    itself, so greedy decoding repeats one token forever);
  - attention and FFN outputs are about as large as the residual stream, so a sequence's
    tokens (and therefore a KV cache mix-up between sequences) change what comes next.

Usage:
    python scripts/make_tiny_gguf.py OUT.gguf --tokenizer-from REAL.gguf --seed 0

Without --tokenizer-from the tokenizer comes from pycacheflow's default model
(pycacheflow.model_hub.ensure_default_model()), when that module is importable.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "llama"
TOKENIZER_KEY_PREFIX = "tokenizer."
DTYPES = {"f32": np.float32, "f16": np.float16}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class TinyLlamaConfig:
    """Hyper-parameters of the tiny model; the vocabulary size comes from the tokenizer."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2  # grouped-query attention: 2 query heads share each KV head
    n_ff: int = 128
    n_ctx_train: int = 2048  # tokens
    rope_freq_base: float = 10000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx_train"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.n_head % self.n_head_kv != 0:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _scalar_value(field: gguf.ReaderField) -> object:
    """Return a scalar field's value; strings stay raw bytes so they copy byte for byte."""
    part = field.parts[field.data[0]]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part)
    value = part[0].item()
    return bool(value) if field.types[0] == gguf.GGUFValueType.BOOL else value


def _array_value(field: gguf.ReaderField) -> list[object]:
    """Return a one-level array field's items; string items stay raw bytes."""
    if field.types[1] == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return [field.parts[i][0].item() for i in field.data]


def copy_tokenizer(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    """Copy every `tokenizer.*` key of reader into writer.

    Returns:
        The vocabulary size (number of entries of tokenizer.ggml.tokens).
    Raises:
        ValueError: the source has no tokenizer.ggml.tokens array.
    """
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith(TOKENIZER_KEY_PREFIX):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, _array_value(field), vtype, sub_type=field.types[1])
        else:
            writer.add_key_value(key, _scalar_value(field), vtype)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(field.data)
    if n_vocab == 0:
        raise ValueError("the tokenizer source has no tokenizer.ggml.tokens array")
    return n_vocab


def random_weights(cfg: TinyLlamaConfig, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Draw the model's tensors, float32, keyed by GGUF tensor name.

    Shapes are numpy order, i.e. the reverse of GGUF's ne[]: a matrix mapping n_in to n_out
    features is [n_out, n_in]. Each projection has std 1/sqrt(n_in), so it keeps the scale of its
    (RMS-normalised) input; the embedding has std 1, the same scale as the residual stream.
    """
    rng = np.random.default_rng(seed)

    def proj(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))

    def norm(n: int) -> np.ndarray:
        # Gains near 1 but not all equal, so the norm weights are not a no-op in the graph.
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    n_kv = cfg.n_head_kv * cfg.head_dim
    tensors = {"token_embd.weight": rng.standard_normal((n_vocab, cfg.n_embd), dtype=np.float32)}
    for il in range(cfg.n_layer):
        tensors |= {
            f"blk.{il}.attn_norm.weight": norm(cfg.n_embd),
            f"blk.{il}.attn_q.weight": proj(cfg.n_embd, cfg.n_embd),
            f"blk.{il}.attn_k.weight": proj(n_kv, cfg.n_embd),
            f"blk.{il}.attn_v.weight": proj(n_kv, cfg.n_embd),
            # Attention averages values, which shrinks them by about sqrt(#attended); the
            # factor 2 keeps the attention output comparable to the residual.
            f"blk.{il}.attn_output.weight": 2.0 * proj(cfg.n_embd, cfg.n_embd),
            f"blk.{il}.ffn_norm.weight": norm(cfg.n_embd),
            f"blk.{il}.ffn_gate.weight": proj(cfg.n_ff, cfg.n_embd),
            f"blk.{il}.ffn_up.weight": proj(cfg.n_ff, cfg.n_embd),
            f"blk.{il}.ffn_down.weight": proj(cfg.n_embd, cfg.n_ff),
        }
    tensors["output_norm.weight"] = norm(cfg.n_embd)
    # Large logits make greedy choices clear-cut (big gaps between the top two logits relative
    # to float rounding), so batched and alone runs agree token for token.
    tensors["output.weight"] = 4.0 * proj(n_vocab, cfg.n_embd)
    return tensors


def write_tiny_gguf(
    out_path: Path | str,
    tokenizer_from: Path | str,
    seed: int = 0,
    dtype: str = "f32",
    cfg: TinyLlamaConfig | None = None,
) -> Path:
    """Write the tiny model to out_path (overwritten if present).

    Args:
        out_path: destination .gguf file.
        tokenizer_from: a GGUF whose tokenizer.* keys are copied.
        seed: seed of numpy's default generator; same seed, same file.
        dtype: "f32" or "f16" for the matrices (norm weights are always f32).
        cfg: model shape; TinyLlamaConfig() if None.
    Returns:
        out_path as a Path.
    Raises:
        ValueError: unknown dtype or a tokenizer source without tokens.
        OSError: tokenizer_from cannot be read or out_path cannot be written.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    cfg = cfg or TinyLlamaConfig()
    out_path = Path(out_path)
    reader = gguf.GGUFReader(str(tokenizer_from))
    writer = gguf.GGUFWriter(str(out_path), ARCH)
    _add_hparams(writer, cfg, dtype)
    n_vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(n_vocab)
    for name, tensor in random_weights(cfg, n_vocab, seed).items():
        keep_f32 = tensor.ndim == 1  # ggml wants 1-D (norm) weights in f32
        writer.add_tensor(name, tensor if keep_f32 else tensor.astype(DTYPES[dtype]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _add_hparams(writer: gguf.GGUFWriter, cfg: TinyLlamaConfig, dtype: str) -> None:
    writer.add_name(f"cacheflow tiny llama {cfg.n_layer}x{cfg.n_embd} (random weights)")
    writer.add_file_type(FILE_TYPES[dtype])
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_freq_base)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def default_tokenizer_source() -> Path | None:
    """Return pycacheflow's default model path, fetching it if needed; None if unavailable."""
    try:
        from pycacheflow import model_hub
    except ImportError:
        return None
    return Path(model_hub.ensure_default_model())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output .gguf path")
    parser.add_argument(
        "--tokenizer-from",
        type=Path,
        default=None,
        help="GGUF to copy tokenizer.* keys from (default: pycacheflow's default model)",
    )
    parser.add_argument("--seed", type=int, default=0, help="numpy RNG seed (default 0)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="matrix dtype")
    parser.add_argument("--n-layer", type=int, default=TinyLlamaConfig.n_layer)
    parser.add_argument("--n-embd", type=int, default=TinyLlamaConfig.n_embd)
    parser.add_argument("--n-head", type=int, default=TinyLlamaConfig.n_head)
    parser.add_argument("--n-head-kv", type=int, default=TinyLlamaConfig.n_head_kv)
    parser.add_argument("--n-ff", type=int, default=TinyLlamaConfig.n_ff)
    parser.add_argument("--n-ctx-train", type=int, default=TinyLlamaConfig.n_ctx_train)
    args = parser.parse_args(argv)

    source = args.tokenizer_from or default_tokenizer_source()
    if source is None:
        parser.error("--tokenizer-from is required when pycacheflow.model_hub is unavailable")
    try:
        cfg = TinyLlamaConfig(
            n_layer=args.n_layer,
            n_embd=args.n_embd,
            n_head=args.n_head,
            n_head_kv=args.n_head_kv,
            n_ff=args.n_ff,
            n_ctx_train=args.n_ctx_train,
        )
        out = write_tiny_gguf(args.out, source, seed=args.seed, dtype=args.dtype, cfg=cfg)
    except (ValueError, OSError) as exc:
        print(f"make_tiny_gguf: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

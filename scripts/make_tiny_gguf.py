#!/usr/bin/env python3
"""Write a tiny seeded random-weight llama (or Gemma 3) GGUF reusing a real model's tokenizer.

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

--arch gemma3 writes a model the paged KV path does not cover: Gemma 3's layout (query and key
norms, post-attention and post-FFN norms, a head size that is not n_embd / n_head) with
sliding-window attention on every layer but each --swa-pattern-th, as in the real Gemma 3.

Usage:
    python scripts/make_tiny_gguf.py OUT.gguf --tokenizer-from REAL.gguf --seed 0
    python scripts/make_tiny_gguf.py OUT.gguf --tokenizer-from REAL.gguf --arch gemma3

Without --tokenizer-from the tokenizer comes from pycacheflow's default model
(pycacheflow.model_hub.ensure_default_model()), when that module is importable.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import gguf
import numpy as np

TOKENIZER_KEY_PREFIX = "tokenizer."
DTYPES = {"f32": np.float32, "f16": np.float16}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class TinyLlamaConfig:
    """Hyper-parameters of the tiny model; the vocabulary size comes from the tokenizer."""

    arch: ClassVar[str] = "llama"

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


@dataclass(frozen=True)
class TinyGemma3Config(TinyLlamaConfig):
    """A tiny Gemma 3: sliding-window attention, so CacheFlow serves it with the stock KV cache.

    Like Gemma 3 270M, one KV head and a head size that is not n_embd / n_head. Layer il uses
    sliding-window attention unless il % swa_pattern == swa_pattern - 1 (llama.cpp's rule), so
    the default 2 layers are one sliding-window layer and one full-attention layer.
    """

    arch: ClassVar[str] = "gemma3"

    n_head_kv: int = 1
    n_embd_head: int = 32  # per head, for queries, keys and values; n_head * 32 != n_embd
    sliding_window: int = 64  # tokens
    swa_pattern: int = 2
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_embd_head", "sliding_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.swa_pattern < 2:
            raise ValueError(
                f"swa_pattern must be >= 2 (1 leaves no sliding-window layer), got "
                f"{self.swa_pattern}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd_head


CONFIGS = {cls.arch: cls for cls in (TinyLlamaConfig, TinyGemma3Config)}


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
    Gemma 3 adds query/key norms and post-attention/post-FFN norms to each layer.
    """
    rng = np.random.default_rng(seed)

    def proj(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))

    def norm(n: int) -> np.ndarray:
        # Gains near 1 but not all equal, so the norm weights are not a no-op in the graph.
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    n_q = cfg.n_head * cfg.head_dim  # n_embd for llama
    n_kv = cfg.n_head_kv * cfg.head_dim
    tensors = {"token_embd.weight": rng.standard_normal((n_vocab, cfg.n_embd), dtype=np.float32)}
    if isinstance(cfg, TinyGemma3Config):
        # Gemma scales the embedding by sqrt(n_embd) in the graph; undo that here so the residual
        # stream starts at std 1, as large as what each layer adds.
        tensors["token_embd.weight"] /= np.float32(np.sqrt(cfg.n_embd))
    for il in range(cfg.n_layer):
        tensors |= {
            f"blk.{il}.attn_norm.weight": norm(cfg.n_embd),
            f"blk.{il}.attn_q.weight": proj(n_q, cfg.n_embd),
            f"blk.{il}.attn_k.weight": proj(n_kv, cfg.n_embd),
            f"blk.{il}.attn_v.weight": proj(n_kv, cfg.n_embd),
            # Attention averages values, which shrinks them by about sqrt(#attended); the
            # factor 2 keeps the attention output comparable to the residual.
            f"blk.{il}.attn_output.weight": 2.0 * proj(cfg.n_embd, n_q),
            f"blk.{il}.ffn_norm.weight": norm(cfg.n_embd),
            f"blk.{il}.ffn_gate.weight": proj(cfg.n_ff, cfg.n_embd),
            f"blk.{il}.ffn_up.weight": proj(cfg.n_ff, cfg.n_embd),
            f"blk.{il}.ffn_down.weight": proj(cfg.n_embd, cfg.n_ff),
        }
        # Gemma's extra norms are drawn after the llama tensors, so llama files stay unchanged.
        if isinstance(cfg, TinyGemma3Config):
            tensors |= {
                f"blk.{il}.attn_q_norm.weight": norm(cfg.head_dim),
                f"blk.{il}.attn_k_norm.weight": norm(cfg.head_dim),
                f"blk.{il}.post_attention_norm.weight": norm(cfg.n_embd),
                f"blk.{il}.post_ffw_norm.weight": norm(cfg.n_embd),
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
        cfg: model shape and architecture (TinyLlamaConfig or TinyGemma3Config);
            TinyLlamaConfig() if None.
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
    writer = gguf.GGUFWriter(str(out_path), cfg.arch)
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
    writer.add_name(f"cacheflow tiny {cfg.arch} {cfg.n_layer}x{cfg.n_embd} (random weights)")
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
    if isinstance(cfg, TinyGemma3Config):
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern(cfg.swa_pattern)


def default_tokenizer_source() -> Path | None:
    """Return pycacheflow's default model path, fetching it if needed; None if unavailable."""
    try:
        from pycacheflow import model_hub
    except ImportError:
        return None
    return Path(model_hub.ensure_default_model())


def _config_from_args(args: argparse.Namespace) -> TinyLlamaConfig:
    """The model config the command line asks for; ValueError on a bad shape."""
    cls = CONFIGS[args.arch]
    shape = {
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "n_head": args.n_head,
        "n_head_kv": cls.n_head_kv if args.n_head_kv is None else args.n_head_kv,
        "n_ff": args.n_ff,
        "n_ctx_train": args.n_ctx_train,
    }
    if cls is TinyGemma3Config:
        shape |= {"sliding_window": args.sliding_window, "swa_pattern": args.swa_pattern}
    return cls(**shape)


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
    parser.add_argument("--arch", choices=sorted(CONFIGS), default="llama", help="architecture")
    parser.add_argument("--n-layer", type=int, default=TinyLlamaConfig.n_layer)
    parser.add_argument("--n-embd", type=int, default=TinyLlamaConfig.n_embd)
    parser.add_argument("--n-head", type=int, default=TinyLlamaConfig.n_head)
    parser.add_argument("--n-head-kv", type=int, default=None, help="default 2 (llama), 1 (gemma3)")
    parser.add_argument("--n-ff", type=int, default=TinyLlamaConfig.n_ff)
    parser.add_argument("--n-ctx-train", type=int, default=TinyLlamaConfig.n_ctx_train)
    parser.add_argument(
        "--sliding-window",
        type=int,
        default=TinyGemma3Config.sliding_window,
        help="gemma3: window of the sliding-window layers, in tokens",
    )
    parser.add_argument(
        "--swa-pattern",
        type=int,
        default=TinyGemma3Config.swa_pattern,
        help="gemma3: every N-th layer has full attention, the others a sliding window",
    )
    args = parser.parse_args(argv)

    source = args.tokenizer_from or default_tokenizer_source()
    if source is None:
        parser.error("--tokenizer-from is required when pycacheflow.model_hub is unavailable")
    try:
        cfg = _config_from_args(args)
        out = write_tiny_gguf(args.out, source, seed=args.seed, dtype=args.dtype, cfg=cfg)
    except (ValueError, OSError) as exc:
        print(f"make_tiny_gguf: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

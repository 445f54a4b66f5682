#!/usr/bin/env bash
# One command on the GPU machine (the project's GPU notes, shared/GPU.md outside this repository): CUDA build, the GPU tests (pytest -m gpu), the
# paged attention kernel benchmark, and decode throughput of CacheFlow (paged and stock KV) vs
# llama-batched-bench on a random-weight model of the Llama-3.2-1B shape, all in the same run.
#
# Prepare here first: bash scripts/prepare_gpu_carry.sh (fills the git-ignored _carry/ folder).
# On the machine: bash scripts/h200_gpu_tests.sh   (OUT=results/h200_gpu, BUILD_DIR=/tmp/cf-cuda-build,
# STAGES="build tests kernel decode profile" to run a subset (profile: PROFILE_KV_MODES="paged stock" runs
# each KV mode, PROFILE_PADDING_AB=1 paged again without step padding); NPL="1 64 256" batches for the decode stage
# (DECODE_MODES="paged stock" the engine's KV modes there), PROFILE_GRAPHS_OFF=0 skips the profile's
# runs without CUDA graphs,
# PROFILE_NPL for the profile stage: the engine's decode step under nsys, kernel + CUDA API summaries;
# stage ncu: kernel time by kernel name of a few decode steps, NCU_NPL batches; stage serve: `cacheflow
# serve` vs in-process LLM.generate on the same 128/128 requests at SERVE_STREAMS streams, issue 12;
# stage gemm: paged decode at GEMM_NPL for each CACHEFLOW_CUDA_GEMM option of patch 0008; stage
# vs_llama_server: `cacheflow bench serve` against cacheflow serve and llama-server at VS_NP streams,
# with the load generator's own ceiling, the CUDA graph counts and padding from /metrics, and with
# VS_PADDING_AB=1 cacheflow serve again without step padding / per-shape graphs; needs BUILD_SERVER=1); stage preemption: bench_preemption.py on the GPU, swap on the copy stream vs llama.cpp's
# copies vs recompute vs auto vs stock (PREEMPT_LENS, PREEMPT_N, PREEMPT_MODES; PREEMPT_SHAREGPT_N: also that many
# ShareGPT requests from _carry/sharegpt_requests.jsonl), issue 13; stage prefix: cacheflow serve with the
# prefix cache on / off vs llama-server, shared-prefix and multi-turn workloads at PREFIX_NP, issue 14 (BUILD_SERVER=1;
# PREFIX_WAIT_AB_NP: the -np values at which a fourth server, cache on with CACHEFLOW_SHARED_PREFIX_WAIT=0, joins as a
# baseline); stage flashinfer:
# scripts/bench_flashinfer_decode.sh, the paged attention kernel next to FlashInfer's batch decode on the kernel
# stage's shapes (FlashInfer's headers from _carry/flashinfer, prepare_gpu_carry.sh; needs only nvcc), issue 11;
# stage priority: bench_priority.py on the GPU under saturation, urgent p99 TTFT under "priority" vs "fcfs" (preemption
# by swap on the copy stream; PRIO_NUM_LOW, PRIO_LOW_TOKENS, PRIO_URGENT_INTERVAL_MS), issue 13, about a minute;
# stage kvstream: bench_kv_streaming.py on a random-weight Llama-3.1-8B-shape model (written beside the build, MODEL_8B),
# KVS_CASES PROMPTxBATCH, KVS_MODES, KVS_OUT_LEN, KVS_PREFILL (rows|mma), plus the pinned host-to-device reference,
# issue 16 (KVS_STANDALONE=0 skips the standalone kv_stream bench). DECODE_PA_KERNELS="two_pass pipelined" runs the
# decode stage's paged runs once per decode kernel. GPU_TESTS_K: a pytest -k expression for the tests stage. Stage
# trace: a CUPTI device timeline of the replayed decode graphs (native/bench/cupti_kernel_trace.cpp, then
# scripts/cupti_step_gaps.py), engine in TRACE_KV_MODES and llama-batched-bench, at TRACE_NPL batches (TRACE_LINES
# of each summary go to run.log; stage ncu_stalls: where the attention kernel's warps wait in place, ncu's warp-state
# and source-counter sections, NCU_STALL_NPL / NCU_STALL_ENVS, the stock engine's flash attention beside it; TRACE_ENVS: NAME=VALUE settings, each a further paged run; TRACE_BB=0 skips
# llama-batched-bench). A DECODE_PA_KERNELS entry NAME=VALUE[,NAME=VALUE...] runs the paged decode with those variables set. KERNEL_BENCH_ARGS: the kernel stage's arguments to the test binary (default --bench;
# "--bench short": the short-context decode shapes alone, at B = 1 to 256).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/h200_gpu}
BUILD_DIR=${BUILD_DIR:-/tmp/cf-cuda-build}
STAGES=${STAGES:-"build tests kernel decode"}
NPL=${NPL:-"64 256"}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/run.log" >&2; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
# the last line of run.log is always "[time] exit <rc>": a caller polling a nohup'd run waits for it
# (grep -q '] exit ' run.log), never for a process name, which its own command line also matches
trap 'log "exit $?"' EXIT

if want build; then
  log "install wheels"
  python -m pip install -q --no-deps --no-index --find-links _carry/wheels cffi pycparser starlette uvicorn \
      prometheus_client httpx httpcore h11 anyio sniffio idna certifi typing_extensions tqdm gguf pyyaml orjson httptools uvloop \
      2>&1 | tail -2 || true
  if want kvstream && [ ! -f "${MODEL_8B:-/tmp/llama-8b-shape-f16.gguf}" ]; then
    # the 8B-shape model (16 GB) takes a couple of minutes of one core: written beside the build
    log "write the 8B-shape random-weight model in the background"
    nohup python scripts/make_tiny_gguf.py "${MODEL_8B:-/tmp/llama-8b-shape-f16.gguf}.part" \
        --tokenizer-from _carry/tokenizer.gguf --dtype f16 --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 \
        --n-ff 14336 --n-ctx-train 131072 --seed 0 > "$OUT/make_8b.log" 2>&1 \
        && mv "${MODEL_8B:-/tmp/llama-8b-shape-f16.gguf}.part" "${MODEL_8B:-/tmp/llama-8b-shape-f16.gguf}" &
  fi
  log "build (CUDA) in $BUILD_DIR"
  export CACHEFLOW_LLAMA_CPP_DIR=$PWD/_carry/llama.cpp CACHEFLOW_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16
  # vendor/llama.cpp stays: its stamp re-prepares it when a patch changed, and files whose bytes did not change keep
  # their times (fetch_llama_cpp.py), so a warm machine's second build recompiles only what the change touched
  python -m pip install -q --no-build-isolation --no-deps -C build-dir="$BUILD_DIR" . > "$OUT/build.log" 2>&1 \
      || { tail -40 "$OUT/build.log"; exit 1; }
  cmake --build "$BUILD_DIR" --target llama-batched-bench ${BUILD_SERVER:+llama-server} -j 16 > "$OUT/build_tools.log" 2>&1 \
      || { log "tools build failed:"; grep -m3 -A3 "Error\|error:" "$OUT/build_tools.log" | tee -a "$OUT/run.log"; exit 1; }
  mkdir -p build && ln -sfn "$BUILD_DIR" build/cuda  # where the benchmarks look for llama-batched-bench
  log "built"
fi

MODEL=${MODEL:-/tmp/llama-1b-shape-f16.gguf}
# stages kernel and flashinfer need only nvcc: no model (nor the gguf package make_tiny_gguf.py imports)
needs_model() { local s; for s in $STAGES; do case $s in kernel|flashinfer) ;; *) return 0 ;; esac; done; return 1; }
if needs_model && [ ! -f "$MODEL" ]; then
  log "write random-weight model $MODEL"
  python scripts/make_tiny_gguf.py "$MODEL" --tokenizer-from _carry/tokenizer.gguf --dtype f16 \
      --n-layer 16 --n-embd 2048 --n-head 32 --n-head-kv 8 --n-ff 8192 --n-ctx-train 131072 --seed 0
fi

if want tests; then
  log "GPU tests (pytest -m gpu)"
  CACHEFLOW_TOKENIZER_GGUF=$PWD/_carry/tokenizer.gguf CACHEFLOW_GPU_RESULTS=$OUT/gpu_agreement.json \
      python -m pytest -q -s -m gpu -p no:cacheprovider --durations=0 ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests/kernels 2>&1 | tee "$OUT/gpu_tests.log" \
      | grep -E "measured|swap on CUDA|beside compute|greedy sequences|passed|failed|FAIL|Error" | tail -20 | tee -a "$OUT/run.log" \
      || log "GPU tests failed"
fi

if want kernel; then
  log "paged attention kernel benchmark"
  nvcc -std=c++17 -O3 --use_fast_math -arch=native -I native/src/kernels/cuda \
      native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
      native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/cf_pa_bench
  /tmp/cf_pa_bench ${KERNEL_BENCH_ARGS:---bench} | tee "$OUT/kernel_bench.txt" | tee -a "$OUT/run.log"
fi

if want flashinfer; then  # issue 11: the decode kernel next to FlashInfer's batch decode, same shapes and K/V (nvcc only)
  log "paged attention kernel vs FlashInfer batch decode (headers from _carry/flashinfer)"
  OUT=$OUT bash scripts/bench_flashinfer_decode.sh 2>&1 | grep -E "^==|copy|ratio|issue 11|PASS|FAIL|rror" \
      | tee -a "$OUT/run.log" || log "flashinfer comparison failed (see $OUT/flashinfer_vs_cacheflow.txt)"
fi

if want decode; then
  # DECODE_PA_KERNELS="two_pass pipelined": the paged runs once per CACHEFLOW_PA_KERNEL (paged_attention.cu); an entry
  # loads_<shape> (e.g. "default loads_by_grid") sets CACHEFLOW_PA_LOADS=<shape> instead (the two-pass load shapes)
  pa_kernels=${DECODE_PA_KERNELS:-default}
  for npl in $NPL; do
    for mode in ${DECODE_MODES:-paged stock}; do
      for pak in $pa_kernels; do
        [ "$mode" != paged ] && [ "$pak" != "${pa_kernels%% *}" ] && continue  # stock: once
        tag="decode_${mode}_b${npl}_p${NPP:-128}"; [ "$pak" != default ] && [ "$mode" = paged ] && tag="${tag}_$(echo "$pak" | tr '=,/' '___')"
        log "decode: cacheflow ($mode KV${pak:+, kernel $pak}) vs llama-batched-bench, npl $npl"
        mkdir -p "$OUT/$tag"
        ( case $pak in default) ;; loads_*) export CACHEFLOW_PA_LOADS=${pak#loads_} ;; *=*) if [ "$mode" = paged ]; then for kv in ${pak//,/ }; do export "$kv"; done; fi ;;
            *) export CACHEFLOW_PA_KERNEL=$pak ;; esac
          timeout 300 python scripts/bench_decode.py -m "$MODEL" --npp "${NPP:-128}" --ntg 128 --npl "$npl" -i ${ITER:-2} \
              -t 8 -ngl 99 --kv-mode "$mode" --out "$OUT/$tag" 2>&1 | grep -E "^iter |_median|ratio_tg|rror" \
              | tee -a "$OUT/run.log" ) || log "decode bench ($mode, $npl, $pak) failed"
      done
    done
  done
fi
if want gemm; then  # patch 0008's options, A/B in one run (CACHEFLOW_CUDA_GEMM: 0 stock, 1 F32 output, 2 shared src1, 3 both)
  for npl in ${GEMM_NPL:-64 256}; do
    for opt in ${GEMM_OPTIONS:-0 1 2 3}; do
      log "decode: cacheflow (paged KV), CACHEFLOW_CUDA_GEMM=$opt, npl $npl"
      CACHEFLOW_CUDA_GEMM=$opt timeout 300 python scripts/bench_decode.py -m "$MODEL" --npp "${NPP:-128}" --ntg 128 \
          --npl "$npl" -i ${ITER:-2} -t 8 -ngl 99 --kv-mode paged --out "$OUT/gemm_o${opt}_b${npl}" 2>&1 | tail -4 \
          | tee -a "$OUT/run.log" || log "decode bench (gemm $opt, $npl) failed"
    done
  done
fi
if want profile; then
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1 || true)
  for npl in ${PROFILE_NPL:-64 256}; do
    log "profile: engine decode step at B=$npl (paged)"
    if [ -n "$NSYS" ]; then
      "$NSYS" profile -t cuda -f true -o "/tmp/cf_prof_b$npl" python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" \
          2>&1 | grep -E "warm-up|measured" | tee -a "$OUT/run.log"
      "$NSYS" stats -q -r cuda_gpu_kern_sum,cuda_api_sum "/tmp/cf_prof_b$npl.nsys-rep" > "$OUT/nsys_b$npl.txt" 2>&1 \
          || log "nsys stats failed"
    else
      log "nsys not found: step times with CUDA graphs on, then off (GGML_CUDA_DISABLE_GRAPHS=1)"
      for sampling in ${PROFILE_SAMPLING:-greedy}; do
        for kv in ${PROFILE_KV_MODES:-paged}; do
          python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --sampling "$sampling" --kv-mode "$kv" 2>&1 \
              | grep -E "measured|CF_DECODE_TIMING" | tail -3 | tee -a "$OUT/run.log"
        done
        # PROFILE_ENVS="GGML_CUDA_PDL=0 CACHEFLOW_PA_PDL=0": each KV mode again with one of these set (A/B of a knob;
        # CF_DECODE_TIMING lines, where a build prints them, come along)
        for envset in ${PROFILE_ENVS:-}; do
          for kv in ${PROFILE_KV_MODES:-paged}; do
            env "$envset" python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --sampling "$sampling" --kv-mode "$kv" \
                2>&1 | grep -E "measured|CF_DECODE_TIMING" | tail -3 | sed "s|^|$envset: |" | tee -a "$OUT/run.log" || true
          done
        done
        if [ "${PROFILE_PADDING_AB:-0}" = 1 ]; then
          CACHEFLOW_STEP_PADDING=0 python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --sampling "$sampling" \
              2>&1 | grep measured | sed 's/^/step padding off: /' | tee -a "$OUT/run.log"
        fi
        if [ "${PROFILE_GRAPHS_OFF:-1}" = 1 ]; then
          for kv in ${PROFILE_KV_MODES:-paged}; do
            GGML_CUDA_DISABLE_GRAPHS=1 python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --sampling "$sampling" \
                --kv-mode "$kv" 2>&1 | grep measured | sed 's/^/graphs off: /' | tee -a "$OUT/run.log"
          done
        fi
      done
    fi
  done
fi
if want ncu; then
  # kernel time of a few decode steps (ncu serializes kernels: for the breakdown, not the speed). NCU_INSITU=1:
  # without ncu's cache flush and clock lock (--cache-control none --clock-control none), so that a kernel's time
  # includes the L2 state the previous kernels left and the boost clock, as in a real step (issue 11's B=1 gap:
  # stop 27 found the flushed, base-clock figures level with flash attention, which hides per-kernel latency).
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
  NCU_EXTRA=()
  [ -n "${NCU_INSITU:-}" ] && NCU_EXTRA=(--cache-control none --clock-control none)
  for npl in ${NCU_NPL:-64 256}; do
    # NCU_KV_MODES="paged stock": the engine's stock KV mode (flash attention) too, the same window, for a per-kernel
    # diff of one engine in both modes; NCU_NTG: output tokens per request (a larger one, e.g. 256 with NCU_SKIP 8000,
    # keeps the window inside the warm-up run's decode steps, clear of any prefill)
    for kv in $([ -z "${NCU_GRAPH_ONLY:-}" ] && echo "${NCU_KV_MODES:-paged}" || true); do  # NCU_GRAPH_ONLY=1: only NCU_GRAPH's
      tag=$([ "$kv" = paged ] && echo "b$npl" || echo "${kv}_engine_b$npl")
      step_kernel=$([ "$kv" = paged ] && echo paged_attention_split || echo flash_attn_ext)
      log "ncu: kernel time by kernel, decode steps at B=$npl ($kv KV; launches ${NCU_SKIP:-6000}.. of the warm-up run)"
      "$NCU" --csv "${NCU_EXTRA[@]}" --metrics gpu__time_duration.sum -s "${NCU_SKIP:-6000}" -c "${NCU_COUNT:-1500}" \
          python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --npp 16 --ntg "${NCU_NTG:-32}" --kv-mode "$kv" \
          > "/tmp/ncu_$tag.csv" 2> /dev/null || true
      python scripts/ncu_summary.py --per-step-kernel "$step_kernel" "/tmp/ncu_$tag.csv" > "$OUT/ncu_$tag.txt" 2>&1 || true
      head -22 "$OUT/ncu_$tag.txt" | tee -a "$OUT/run.log"; tail -2 "$OUT/ncu_$tag.txt" | tee -a "$OUT/run.log"
    done
    if [ -n "${NCU_GRAPH:-}" ]; then
      # device time of whole CUDA graphs (--graph-profiling graph: one result per graph launch, i.e. per replayed
      # step), the engine in each NCU_KV_MODES mode and llama-batched-bench: says whether a step's gap is device
      # time or host time between graph launches (issue 11's B=1 gap)
      for kv in ${NCU_KV_MODES:-paged}; do
        log "ncu: device time per CUDA graph launch at B=$npl ($kv KV engine)"
        "$NCU" --csv "${NCU_EXTRA[@]}" --graph-profiling graph --metrics gpu__time_duration.sum -c "${NCU_GRAPH_COUNT:-1200}" \
            python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --npp 16 --ntg "${NCU_NTG:-32}" --kv-mode "$kv" \
            > "/tmp/ncu_graph_${kv}_b$npl.csv" 2> /dev/null || true
        python scripts/ncu_summary.py "/tmp/ncu_graph_${kv}_b$npl.csv" > "$OUT/ncu_graph_${kv}_b$npl.txt" 2>&1 || true
        head -14 "$OUT/ncu_graph_${kv}_b$npl.txt" | tee -a "$OUT/run.log"
      done
      log "ncu: device time per CUDA graph launch at B=$npl (llama-batched-bench, stock KV, -fa on)"
      BB=$(find "$BUILD_DIR" -name llama-batched-bench -type f | head -1)
      "$NCU" --csv "${NCU_EXTRA[@]}" --graph-profiling graph --metrics gpu__time_duration.sum -c "${NCU_GRAPH_COUNT:-1200}" \
          "$BB" -m "$MODEL" -c $((npl * 512)) -b 2048 -ub 512 -npp 16 -ntg 128 -npl "$npl" -ngl 99 -fa on \
          > "/tmp/ncu_graph_bb_b$npl.csv" 2> /dev/null || true
      python scripts/ncu_summary.py "/tmp/ncu_graph_bb_b$npl.csv" > "$OUT/ncu_graph_bb_b$npl.txt" 2>&1 || true
      head -14 "$OUT/ncu_graph_bb_b$npl.txt" | tee -a "$OUT/run.log"
    fi
    if [ -n "${NCU_STOCK:-}" ] && [ -z "${NCU_GRAPH_ONLY:-}" ]; then  # the same breakdown for llama-batched-bench (stock KV, flash attention)
      log "ncu: llama-batched-bench decode steps at B=$npl (stock KV, -fa on)"
      BB=$(find "$BUILD_DIR" -name llama-batched-bench -type f | head -1)
      "$NCU" --csv "${NCU_EXTRA[@]}" --metrics gpu__time_duration.sum -s "${NCU_SKIP:-6000}" -c "${NCU_COUNT:-1500}" \
          "$BB" -m "$MODEL" -c $((npl * 512)) -b 2048 -ub 512 -npp 16 -ntg 64 -npl "$npl" -ngl 99 -fa on \
          > "/tmp/ncu_stock_b$npl.csv" 2> /dev/null || true
      python scripts/ncu_summary.py --per-step-kernel flash_attn_ext "/tmp/ncu_stock_b$npl.csv" > "$OUT/ncu_stock_b$npl.txt" 2>&1 || true
      head -22 "$OUT/ncu_stock_b$npl.txt" | tee -a "$OUT/run.log"; tail -2 "$OUT/ncu_stock_b$npl.txt" | tee -a "$OUT/run.log"
    fi
  done
fi
if want ncu_stalls; then
  # issue 11's B=1 gap: why the attention kernel runs longer in the engine's replayed graph than alone (stop 38: 15-17
  # us per layer in place, 12-13 back to back). One decode-step attention launch per layer, in place (no cache flush
  # or clock lock), with ncu's warp-state and source-counter sections: where its warps wait (long scoreboard = global
  # memory, barrier, no instruction = instruction cache, ...). NCU_STALL_NPL batches; NCU_STALL_ENVS NAME=VALUE
  # settings, each a further run (e.g. CACHEFLOW_PA_LOADS=wide); the stock engine's flash attention beside it.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
  for npl in ${NCU_STALL_NPL:-1}; do
    for run in paged ${NCU_STALL_ENVS:-} stock; do
      case $run in
        paged) kv=paged; kname=paged_attention_split; envset=CF_NCU_STALLS=1 ;;
        stock) kv=stock; kname=flash_attn_ext_vec; envset=CF_NCU_STALLS=1 ;;
        *=*) kv=paged; kname=paged_attention_split; envset=$run ;;
        *) log "ncu_stalls: NCU_STALL_ENVS entry $run is not NAME=VALUE; skipped"; continue ;;
      esac
      tag=${kv}_$(echo "$envset" | tr '=,/' '___')_b$npl
      log "ncu_stalls: $kname in place at B=$npl ($kv KV, $envset)"
      # skip the warm-up run's prefill and first decode steps: 16 layers x 64 steps of the matching kernel
      env "$envset" "$NCU" --cache-control none --clock-control none --kernel-name "regex:$kname" \
          --launch-skip "${NCU_STALL_SKIP:-1024}" --launch-count "${NCU_STALL_COUNT:-2}" \
          --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
          --section SourceCounters --section MemoryWorkloadAnalysis \
          python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --npp 128 --ntg 128 --kv-mode "$kv" \
          > "$OUT/ncu_stalls_$tag.txt" 2>&1 || true
      grep -E "Duration|Registers Per|Achieved Occupancy|Stall|stall|Warp Cycles Per Issued|Issue Slots" \
          "$OUT/ncu_stalls_$tag.txt" | head -24 | tee -a "$OUT/run.log"
    done
  done
fi
if want trace; then
  # issue 11: a device timeline of replayed decode graphs (CUPTI activity records; nsys is absent on the machine),
  # the engine in each TRACE_KV_MODES mode and llama-batched-bench, at TRACE_NPL batches: per step the graph's span,
  # busy and idle time, and the idle time before each kernel (scripts/cupti_step_gaps.py)
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  CUPTI_LIB=$(ls "$CUDA_HOME"/lib64/libcupti.so "$CUDA_HOME"/extras/CUPTI/lib64/libcupti.so 2>/dev/null | head -1 || true)
  CUPTI_INC=$(dirname "$(ls "$CUDA_HOME"/include/cupti.h "$CUDA_HOME"/extras/CUPTI/include/cupti.h 2>/dev/null | head -1)")
  if [ -z "$CUPTI_LIB" ] || ! g++ -std=c++17 -O2 -shared -fPIC native/bench/cupti_kernel_trace.cpp -I"$CUPTI_INC" \
      -I"$CUDA_HOME/include" "$CUPTI_LIB" -Wl,-rpath,"$(dirname "$CUPTI_LIB")" -o /tmp/libcf_cupti_trace.so \
      > "$OUT/trace_build.log" 2>&1; then
    log "trace: no CUPTI library or the tracer did not build (trace_build.log)"
  else
    for npl in ${TRACE_NPL:-1 64}; do
      for kv in ${TRACE_KV_MODES:-paged stock}; do
        log "trace: engine decode graphs at B=$npl ($kv KV)"
        rm -f "/tmp/trace_${kv}_b$npl.csv"  # the tracer writes nothing for a run that recorded nothing
        CF_CUPTI_TRACE="/tmp/trace_${kv}_b$npl.csv" LD_PRELOAD=/tmp/libcf_cupti_trace.so \
            python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --kv-mode "$kv" 2>&1 \
            | grep -E "measured|cupti_kernel_trace" | tee -a "$OUT/run.log" || true
        python scripts/cupti_step_gaps.py "/tmp/trace_${kv}_b$npl.csv" > "$OUT/trace_${kv}_b$npl.txt" 2>&1 || true
        head -"${TRACE_LINES:-14}" "$OUT/trace_${kv}_b$npl.txt" | tee -a "$OUT/run.log"
      done
      # TRACE_ENVS="CACHEFLOW_PA_LOADS=narrow CACHEFLOW_PA_PDL=1": the paged engine again with each setting (A/B)
      for envset in ${TRACE_ENVS:-}; do
        case $envset in *=*) ;; *) log "trace: TRACE_ENVS entry $envset is not NAME=VALUE; skipped"; continue ;; esac
        tag=paged_$(echo "$envset" | tr '=,/' '___')
        log "trace: engine decode graphs at B=$npl (paged KV, $envset)"
        rm -f "/tmp/trace_${tag}_b$npl.csv"
        env "$envset" CF_CUPTI_TRACE="/tmp/trace_${tag}_b$npl.csv" LD_PRELOAD=/tmp/libcf_cupti_trace.so \
            python scripts/profile_gpu_step.py -m "$MODEL" --npl "$npl" --kv-mode paged 2>&1 \
            | grep -E "measured|cupti_kernel_trace" | tee -a "$OUT/run.log" || true
        python scripts/cupti_step_gaps.py "/tmp/trace_${tag}_b$npl.csv" > "$OUT/trace_${tag}_b$npl.txt" 2>&1 || true
        head -"${TRACE_LINES:-14}" "$OUT/trace_${tag}_b$npl.txt" | tee -a "$OUT/run.log"
      done
      [ "${TRACE_BB:-1}" = 0 ] && continue
      BB=$(find "$BUILD_DIR" -name llama-batched-bench -type f | head -1)
      if [ -z "$BB" ]; then
        log "trace: no llama-batched-bench in $BUILD_DIR (stage build builds it)"
        continue
      fi
      log "trace: llama-batched-bench decode graphs at B=$npl (stock KV, -fa on)"
      rm -f "/tmp/trace_bb_b$npl.csv"
      CF_CUPTI_TRACE="/tmp/trace_bb_b$npl.csv" LD_PRELOAD=/tmp/libcf_cupti_trace.so \
          "$BB" -m "$MODEL" -c $((npl * 512)) -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$npl" -ngl 99 -fa on 2>&1 \
          | grep -E "cupti_kernel_trace|^\|" | tail -3 | tee -a "$OUT/run.log" || true
      python scripts/cupti_step_gaps.py "/tmp/trace_bb_b$npl.csv" > "$OUT/trace_bb_b$npl.txt" 2>&1 || true
      head -"${TRACE_LINES:-14}" "$OUT/trace_bb_b$npl.txt" | tee -a "$OUT/run.log"
    done
  fi
fi
if want serve; then
  for streams in ${SERVE_STREAMS:-64 256}; do
    log "serve vs generate: $streams streams (paged, 128/128)"
    timeout 400 python scripts/bench_serve_vs_generate.py --model "$MODEL" --n-gpu-layers 99 --kv-mode paged \
        --streams "$streams" --prompt-len 128 --output-len 128 --batch-tokens 32768 --repeats ${SERVE_REPEATS:-2} \
        --out "$OUT/serve_vs_generate_s$streams.json" 2>&1 | tail -5 | tee -a "$OUT/run.log" \
        || log "serve bench ($streams) failed"
  done
  for streams in ${SERVE_SAMPLING_STREAMS:-64}; do  # issue 15: llama-server's default sampling vs greedy
    log "serve vs generate: $streams streams, llama-server's default sampling (paged, 128/128)"
    timeout 400 python scripts/bench_serve_vs_generate.py --model "$MODEL" --n-gpu-layers 99 --kv-mode paged \
        --streams "$streams" --prompt-len 128 --output-len 128 --batch-tokens 32768 --repeats ${SERVE_REPEATS:-2} \
        --sampling llama-default --out "$OUT/serve_vs_generate_s${streams}_sampling.json" 2>&1 | tail -5 \
        | tee -a "$OUT/run.log" || log "serve bench ($streams, sampling) failed"
  done
fi
if want priority; then  # issue 13: urgent requests under saturation, priority vs fcfs, swaps beside compute
  log "priority: bench_priority.py on the GPU (${PRIO_NUM_LOW:-64} low-priority requests, 16 urgent)"
  python scripts/bench_priority.py -m "$MODEL" -ngl 99 --num-low "${PRIO_NUM_LOW:-64}" --low-prompt 256 \
      --low-tokens "${PRIO_LOW_TOKENS:-256}" --num-urgent 16 --urgent-prompt 32 --urgent-tokens 8 \
      --urgent-start-ms 300 --urgent-interval-ms "${PRIO_URGENT_INTERVAL_MS:-50}" --max-num-seqs 16 --n-ctx 4096 \
      --num-mixed 24 --mixed-seqs 4 --out "$OUT/priority_gpu" 2>&1 | tail -9 | tee -a "$OUT/run.log" \
      || log "priority bench failed"
fi

if want preemption; then  # issue 13: memory pressure on the GPU, swap (copy stream / llama copies) vs recompute vs auto vs stock
  log "preemption: bench_preemption.py on the GPU (prompts ${PREEMPT_LENS:-128 1024}, ${PREEMPT_N:-64} requests)"
  python scripts/bench_preemption.py -m "$MODEL" -ngl 99 --batch-tokens 2048 --prompt-lens ${PREEMPT_LENS:-128 1024} \
      -n "${PREEMPT_N:-64}" -o "${PREEMPT_OUT:-128}" --modes ${PREEMPT_MODES:-swap swap-llama recompute auto stock} --repeats "${PREEMPT_REPEATS:-2}" \
      --out "$OUT/preemption_gpu.json" 2>&1 | grep -v "^{" | tail -24 | tee -a "$OUT/run.log" || log "preemption bench failed"
  if [ -n "${PREEMPT_SHAREGPT_N:-}" ] && [ -f _carry/sharegpt_requests.jsonl ]; then  # ShareGPT's lengths (prepare_gpu_carry.sh)
    log "preemption: ShareGPT, $PREEMPT_SHAREGPT_N requests"
    python scripts/bench_preemption.py -m "$MODEL" -ngl 99 --batch-tokens 2048 --requests-file _carry/sharegpt_requests.jsonl \
        -n "$PREEMPT_SHAREGPT_N" --modes ${PREEMPT_MODES:-swap swap-llama recompute auto stock} \
        --repeats "${PREEMPT_REPEATS:-2}" --out "$OUT/preemption_sharegpt_gpu.json" 2>&1 | grep -v "^{" | tail -8 \
        | tee -a "$OUT/run.log" || log "ShareGPT preemption bench failed"
  fi
fi
# Where the cache-on server's TTFT goes: the server's own TTFT histogram (HTTP request in -> first token out)
# and the engine's (add_request -> first token), as sums and counts since the previous call (a scrape of
# /metrics; the engine table is cumulative, so the caller subtracts), next to the client's figure.
prefix_ttft_parts() {
  curl -s http://127.0.0.1:8091/metrics | grep -E '^cacheflow:(time_to_first_token_seconds_(sum|count)|time_to_first_token_by_priority_seconds_(sum|count)|steps|prompt_tokens_cached|queue)|^llamacpp:(prompt_seconds_total|prompt_tokens_total)' \
      | sed "s/^/[ttft parts: $1] /" | tee -a "$OUT/run.log" || true
}
if want prefix; then  # issue 14: prefix caching through the servers on the GPU, cache on / off / llama-server
  SERVER_BIN=$(find "$BUILD_DIR" -name llama-server -type f | head -1)
  for np in ${PREFIX_NP:-64 256}; do
    log "prefix: cacheflow serve (cache on, off) vs llama-server (cache_prompt) -np $np, shared-prefix and multi-turn"
    ctx=$((np * 2048))
    cacheflow serve -m "$MODEL" -ngl 99 -np "$np" -c "$ctx" --metrics --port 8091 --host 127.0.0.1 > "$OUT/prefix_on_np$np.log" 2>&1 &
    p1=$!
    cacheflow serve -m "$MODEL" -ngl 99 -np "$np" -c "$ctx" --no-cache-prompt --port 8092 --host 127.0.0.1 \
        > "$OUT/prefix_off_np$np.log" 2>&1 &
    p2=$!
    "$SERVER_BIN" -m "$MODEL" -ngl 99 -np "$np" -c "$ctx" -fa on --port 8093 --host 127.0.0.1 > "$OUT/prefix_ls_np$np.log" 2>&1 &
    p3=$!
    ports="8091 8092 8093" baselines="--baseline http://127.0.0.1:8092 --baseline http://127.0.0.1:8093" p4=
    if [[ " ${PREFIX_WAIT_AB_NP:-} " == *" $np "* ]]; then  # A/B: the cache on without the shared-prefix wait
      CACHEFLOW_SHARED_PREFIX_WAIT=0 cacheflow serve -m "$MODEL" -ngl 99 -np "$np" -c "$ctx" --metrics --port 8094 \
          --host 127.0.0.1 > "$OUT/prefix_nowait_np$np.log" 2>&1 &
      p4=$!
      ports="$ports 8094" baselines="$baselines --baseline http://127.0.0.1:8094"
    fi
    for port in $ports; do
      for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
      curl -sf "http://127.0.0.1:$port/completion" -d '{"prompt": "Hello", "n_predict": 4}' > /dev/null || true
    done
    timeout 300 cacheflow bench serve http://127.0.0.1:8091 $baselines \
        -m "$MODEL" --dataset shared-prefix -n $((np * ${PREFIX_MULT:-2})) -p 1000 -o "${PREFIX_OUT:-32}" \
        --max-concurrency "$np" --cache-prompt \
        --out "$OUT/prefix_shared_np$np" 2>&1 | grep -v "req/s" | tail -12 | tee -a "$OUT/run.log" \
        || log "shared-prefix bench (-np $np) failed"
    prefix_ttft_parts "shared-prefix -np $np"
    timeout 300 cacheflow bench serve http://127.0.0.1:8091 $baselines \
        -m "$MODEL" --dataset multi-turn -n "$np" --turns 4 -p 200 --user-len 50 -o "${PREFIX_TURN_OUT:-64}" \
        --max-concurrency "$np" \
        --cache-prompt --out "$OUT/prefix_multiturn_np$np" 2>&1 | grep -v "req/s" | tail -12 | tee -a "$OUT/run.log" \
        || log "multi-turn bench (-np $np) failed"
    prefix_ttft_parts "multi-turn -np $np"
    kill $p1 $p2 $p3 $p4 2>/dev/null || true
    wait $p1 $p2 $p3 $p4 2>/dev/null || true
  done
fi
if want vs_llama_server; then  # issue 11: cacheflow serve (defaults: paged on CUDA) vs llama-server, same build
  SERVER_BIN=$(find "$BUILD_DIR" -name llama-server -type f | head -1)
  for np in ${VS_NP:-64 256}; do
    log "serve: cacheflow serve vs llama-server -np $np ($((np * ${VS_REQ_PER_STREAM:-2})) requests, 128/128)"
    "$SERVER_BIN" -m "$MODEL" -ngl 99 -np "$np" -c $((np * 512)) -fa on --port 8081 --host 127.0.0.1 \
        > "$OUT/llama_server_np$np.log" 2>&1 &
    ls_pid=$!
    cacheflow serve -m "$MODEL" -ngl 99 -np "$np" -c $((np * 512)) --metrics --port 8082 --host 127.0.0.1 \
        > "$OUT/cacheflow_serve_np$np.log" 2>&1 &
    cf_pid=$!
    for port in 8081 8082; do
      for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    done
    mkdir -p "$OUT/vs_llama_server_np$np"
    timeout 300 cacheflow bench serve http://127.0.0.1:8082 --baseline http://127.0.0.1:8081 -m "$MODEL" \
        -n $((np * ${VS_REQ_PER_STREAM:-2})) -p 128 -o 128 --max-concurrency "$np" --client-check \
        --out "$OUT/vs_llama_server_np$np" 2>&1 | grep -v 'req/s' | tail -8 | tee -a "$OUT/run.log" \
        || log "serve bench (-np $np) failed"
    # the share of steps that replayed a CUDA graph while serving, the padding it took, the decodes launched ahead
    curl -s http://127.0.0.1:8082/metrics | grep -E '^cacheflow:(cuda_graph_evaluations|padding_tokens|steps|lookahead)' \
        | tee -a "$OUT/run.log" || true
    kill $ls_pid $cf_pid 2>/dev/null || true
    wait $ls_pid $cf_pid 2>/dev/null || true
    if [ -n "${VS_PADDING_AB:-}" ]; then  # the same cacheflow serve without step padding and per-shape graphs
      log "serve: cacheflow serve -np $np without step padding (CACHEFLOW_STEP_PADDING=0 CACHEFLOW_CUDA_GRAPH_PER_SHAPE=0)"
      CACHEFLOW_STEP_PADDING=0 CACHEFLOW_CUDA_GRAPH_PER_SHAPE=0 cacheflow serve -m "$MODEL" -ngl 99 -np "$np" --metrics \
          -c $((np * 512)) --port 8083 --host 127.0.0.1 > "$OUT/cacheflow_serve_nopad_np$np.log" 2>&1 &
      cf_pid=$!
      for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:8083/health" > /dev/null && break; sleep 1; done
      timeout 300 cacheflow bench serve http://127.0.0.1:8083 -m "$MODEL" -n $((np * ${VS_REQ_PER_STREAM:-2})) -p 128 \
          -o 128 --max-concurrency "$np" --out "$OUT/vs_nopad_np$np" 2>&1 | grep -v 'req/s' | tail -3 \
          | tee -a "$OUT/run.log" || log "serve bench (-np $np, no padding) failed"
      curl -s http://127.0.0.1:8083/metrics | grep -E '^cacheflow:(cuda_graph_evaluations|padding_tokens)' \
          | tee -a "$OUT/run.log" || true
      kill $cf_pid 2>/dev/null || true
      wait $cf_pid 2>/dev/null || true
    fi
  done
fi
if want kvstream; then  # issue 16: long contexts on the 8B shape, streaming vs all on device vs preemption
  MODEL_8B=${MODEL_8B:-/tmp/llama-8b-shape-f16.gguf}
  if [ ! -f "$MODEL_8B" ]; then
    log "waiting for the 8B-shape model"
    for _ in $(seq 1 600); do [ -f "$MODEL_8B" ] && break; sleep 1; done
  fi
  if [ "${KVS_STANDALONE:-1}" = 1 ]; then
    log "pinned host-to-device reference (kv_stream standalone --bench)"
    nvcc -std=c++17 -O3 --use_fast_math -arch=native -I native/src/kernels/cuda -I native/src/kernels \
        native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu native/src/kernels/cuda/kv_stream.cu \
        native/tests/cuda/test_kv_stream_cuda.cu -o /tmp/cf_kvs_bench 2>&1 | tail -3
    /tmp/cf_kvs_bench --bench > "$OUT/kv_stream_bench.txt" 2>&1 || log "kv_stream standalone failed"
    grep -iE "memcpy|gather|PASS|FAIL" "$OUT/kv_stream_bench.txt" | head -8 | tee -a "$OUT/run.log"
  fi
  log "long-context benchmark on the 8B shape: ${KVS_CASES:-32768x1 32768x4 131072x1}"
  # KVS_PREFILL=mma: the engine's prefill chunks take the tensor-core kernel (paged_prefill_mma.cu)
  CACHEFLOW_PAGED_PREFILL=${KVS_PREFILL:-rows} python scripts/bench_kv_streaming.py -m "$MODEL_8B" -ngl 99 --cases ${KVS_CASES:-32768x1 32768x4 131072x1} \
      --modes ${KVS_MODES:-device stream-fit stream recompute swap} --output-len ${KVS_OUT_LEN:-32} \
      --out "$OUT/kv_streaming.json" 2>&1 | tee "$OUT/kv_streaming.log" | grep -E '^\|' | tee -a "$OUT/run.log" \
      || log "long-context benchmark failed"
fi
log "done"

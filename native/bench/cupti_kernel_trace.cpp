// cupti_kernel_trace.cpp - a device timeline where nsys is absent: every kernel, memcpy and memset the process
// runs, with device start / end timestamps, from CUPTI's activity API, written as CSV.
//
// Built on the GPU machine as a shared library and preloaded into the process to trace (scripts/h200_gpu_tests.sh,
// stage trace):
//   g++ -std=c++17 -O2 -shared -fPIC native/bench/cupti_kernel_trace.cpp -I$CUDA/include -L$CUDA/lib64 -lcupti
//       -Wl,-rpath,$CUDA/lib64 -o /tmp/libcf_cupti_trace.so
//   CF_CUPTI_TRACE=/tmp/trace.csv LD_PRELOAD=/tmp/libcf_cupti_trace.so python scripts/profile_gpu_step.py ...
// scripts/cupti_step_gaps.py reads the CSV.
//
// Why CUPTI and not ncu: ncu serializes kernels and times each alone, so it cannot show the time between the
// kernels of a replayed CUDA graph (issue 11's B=1 gap, results/h200_gpu/stop37). CUPTI's concurrent-kernel
// activity records kernels inside graphs as they ran, each with the correlation id of its cudaGraphLaunch, so one
// graph launch (one decode step) is one group of records.
//
// Environment: CF_CUPTI_TRACE = output path (unset: nothing is recorded, though libcupti is still loaded; each
// process that ran something on the device writes the whole file, through a temporary file and a rename, so of
// several such processes (LD_PRELOAD reaches child processes) the last to exit wins, never a mix); CF_CUPTI_MAX_RECORDS = records kept
// (default 2,000,000; later ones are counted, not kept). The CSV is written by cf_cupti_flush() (exported, callable
// through ctypes before the process tears CUDA down) or else at exit. Columns: kind (kernel | memcpy | memset), name
// (kernel name, or the memcpy kind), start_ns, end_ns (device clock, ns), correlation_id, graph_id (0 outside graphs),
// stream_id.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unistd.h>  // getpid
#include <vector>

namespace {

#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
#else
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy5;
#endif
using MemsetRecord = CUpti_ActivityMemset4;

constexpr size_t kBufferBytes = 8u << 20;

struct Record {
    uint8_t kind;  // 0 kernel, 1 memcpy, 2 memset
    int32_t name;  // index into Trace::names
    uint64_t start;
    uint64_t end;
    uint32_t correlation;
    uint32_t graph;
    uint32_t stream;
};

struct Trace {
    std::mutex mu;
    std::string path;
    size_t max_records = 2000000;
    size_t dropped = 0;
    bool written = false;
    std::vector<Record> records;
    std::vector<std::string> names;
    std::unordered_map<std::string, int32_t> name_ids;

    int32_t intern(const char * s) {
        const std::string key = s != nullptr ? s : "?";
        auto it = name_ids.find(key);
        if (it != name_ids.end()) {
            return it->second;
        }
        const int32_t id = (int32_t) names.size();
        names.push_back(key);
        name_ids.emplace(key, id);
        return id;
    }
};

Trace & trace() {
    static Trace * t = new Trace();  // never destroyed: CUPTI may call back during exit
    return *t;
}

const char * memcpy_kind_name(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
        default: return "memcpy other";
    }
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_num_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;
    *max_num_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid_size) {
    Trace & t = trace();
    std::lock_guard<std::mutex> lock(t.mu);
    CUpti_Activity * rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid_size, &rec) == CUPTI_SUCCESS) {
        if (t.records.size() >= t.max_records) {
            ++t.dropped;
            continue;
        }
        Record r{};
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const auto * k = reinterpret_cast<const KernelRecord *>(rec);
            r = {0, t.intern(k->name), k->start, k->end, k->correlationId, k->graphId, k->streamId};
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto * m = reinterpret_cast<const MemcpyRecord *>(rec);
            r = {1, t.intern(memcpy_kind_name(m->copyKind)), m->start, m->end, m->correlationId, m->graphId,
                 m->streamId};
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto * m = reinterpret_cast<const MemsetRecord *>(rec);
            r = {2, t.intern("memset"), m->start, m->end, m->correlationId, m->graphId, m->streamId};
        } else {
            continue;
        }
        t.records.push_back(r);
    }
    std::free(buffer);
}

void write_csv() {
    Trace & t = trace();
    std::lock_guard<std::mutex> lock(t.mu);
    // a process that ran nothing on the device (a launcher script, a child that inherited LD_PRELOAD) writes nothing,
    // so the CSV is the CUDA process's
    if (t.written || t.path.empty() || t.records.empty()) {
        return;
    }
    t.written = true;
    const std::string tmp = t.path + "." + std::to_string((long long) getpid()) + ".tmp";
    FILE * f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) {
        std::fprintf(stderr, "cupti_kernel_trace: cannot write %s\n", tmp.c_str());
        return;
    }
    static const char * const kinds[] = {"kernel", "memcpy", "memset"};
    std::fprintf(f, "kind,name,start_ns,end_ns,correlation_id,graph_id,stream_id\n");
    for (const Record & r : t.records) {
        std::string name = t.names[(size_t) r.name];
        for (char & c : name) {
            if (c == ',' || c == '"' || c == '\n') {
                c = ' ';
            }
        }
        std::fprintf(f, "%s,%s,%llu,%llu,%u,%u,%u\n", kinds[r.kind], name.c_str(), (unsigned long long) r.start,
                     (unsigned long long) r.end, r.correlation, r.graph, r.stream);
    }
    if (std::fclose(f) != 0 || std::rename(tmp.c_str(), t.path.c_str()) != 0) {
        std::fprintf(stderr, "cupti_kernel_trace: cannot write %s\n", t.path.c_str());
        return;
    }
    std::fprintf(stderr, "cupti_kernel_trace: %zu records to %s (%zu dropped past CF_CUPTI_MAX_RECORDS)\n",
                 t.records.size(), t.path.c_str(), t.dropped);
}

bool check(CUptiResult res, const char * what) {
    if (res == CUPTI_SUCCESS) {
        return true;
    }
    const char * msg = nullptr;
    cuptiGetResultString(res, &msg);
    std::fprintf(stderr, "cupti_kernel_trace: %s failed: %s\n", what, msg != nullptr ? msg : "?");
    return false;
}

__attribute__((constructor)) void start_trace() {
    const char * path = std::getenv("CF_CUPTI_TRACE");
    if (path == nullptr || *path == '\0') {
        return;
    }
    Trace & t = trace();
    t.path = path;
    if (const char * v = std::getenv("CF_CUPTI_MAX_RECORDS")) {
        t.max_records = (size_t) std::strtoull(v, nullptr, 10);
    }
    t.records.reserve(t.max_records < 4000000 ? t.max_records : 4000000);
    bool ok = check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
    ok = ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
    ok = ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
    ok = ok && check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
    if (ok) {
        std::atexit([] {
            cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
            write_csv();
        });
    }
}

}  // namespace

// Flush CUPTI's buffers and write the CSV now (once per process); for callers that tear CUDA down before exit.
extern "C" __attribute__((visibility("default"))) void cf_cupti_flush() {
    if (trace().path.empty()) {
        return;  // CF_CUPTI_TRACE unset: nothing was recorded
    }
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    write_csv();
}

// devices.cpp - see devices.h.
#include "engine/devices.h"

#include "core/error.h"
#include "ggml-rpc.h"
#include "llama.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <utility>

namespace cf {

namespace {

constexpr int kConnectTimeoutMs = 5000;

std::vector<std::string> split_list(const std::string & text) {
    std::vector<std::string> items;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t end = std::min(text.find(',', start), text.size());
        items.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return items;
}

// host and port of "host:port" (the port after the last ':'), or throws naming rpc_servers.
void parse_endpoint(const std::string & endpoint, std::string & host, std::string & port) {
    const size_t colon = endpoint.rfind(':');
    const std::string digits = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
    char * end = nullptr;
    const long value = digits.empty() ? 0 : std::strtol(digits.c_str(), &end, 10);
    if (colon == 0 || colon == std::string::npos || digits.empty() || *end != '\0' || value < 1 || value > 65535) {
        fail_invalid("rpc_servers: '" + endpoint + "' is not host:port (a port in [1, 65535])");
    }
    host = endpoint.substr(0, colon);
    port = digits;
}

// Waits until fd is ready for `events` within timeout_ms; false on timeout or error.
bool wait_fd(int fd, short events, int timeout_ms) {
    pollfd p = {fd, events, 0};
    return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & (events | POLLHUP)) != 0;
}

// Sends or receives exactly n bytes on the non-blocking fd, each wait within timeout_ms; false otherwise.
bool send_all(int fd, const uint8_t * data, size_t n, int timeout_ms) {
    while (n > 0) {
        if (!wait_fd(fd, POLLOUT, timeout_ms)) {
            return false;
        }
        const ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
        if (k <= 0) {
            return false;
        }
        data += k;
        n -= (size_t) k;
    }
    return true;
}

bool recv_all(int fd, uint8_t * data, size_t n, int timeout_ms, bool * timed_out) {
    while (n > 0) {
        if (!wait_fd(fd, POLLIN, timeout_ms)) {
            *timed_out = true;
            return false;
        }
        const ssize_t k = ::recv(fd, data, n, 0);
        if (k <= 0) {
            return false;  // closed by the peer
        }
        data += k;
        n -= (size_t) k;
    }
    return true;
}

// The RPC handshake as ggml-rpc's client does it (ggml-rpc.cpp, negotiate_hello, protocol 107 of the
// pinned tree): request | cmd HELLO = 14 (1 byte) | size (8 bytes) | rpc_msg_hello_req (24 bytes of
// transport capabilities; zeros = plain TCP) |, answer | size (8 bytes) | rpc_msg_hello_rsp: major, minor,
// patch, padding, 24 bytes of capabilities |. ggml-rpc itself waits forever for the answer and aborts the
// process on a mismatch, so the engine asks first: "" when an rpc-server of this protocol answered, else why
// not, in words for the user. The probe's connection is closed at once (the server then serves the next).
constexpr uint8_t kRpcCmdHello = 14;
constexpr size_t kRpcCapsBytes = 24;

std::string handshake(int fd, const std::string & endpoint) {
    uint8_t request[1 + 8 + kRpcCapsBytes] = {};
    request[0] = kRpcCmdHello;
    const uint64_t size = kRpcCapsBytes;
    std::memcpy(request + 1, &size, sizeof(size));
    uint8_t answer[8 + 4 + kRpcCapsBytes] = {};
    bool timed_out = false;
    if (!send_all(fd, request, sizeof(request), kConnectTimeoutMs) ||
        !recv_all(fd, answer, 8, kConnectTimeoutMs, &timed_out)) {
        if (timed_out) {
            return "the rpc-server at " + endpoint + " accepted the connection but did not answer the RPC handshake within " +
                   std::to_string(kConnectTimeoutMs / 1000) + " s: it is busy with another engine (an rpc-server serves one "
                   "client at a time) or it is not an rpc-server";
        }
        return endpoint + " closed the connection at the RPC handshake: it is not an rpc-server of this build";
    }
    uint64_t answer_size = 0;
    std::memcpy(&answer_size, answer, sizeof(answer_size));
    if (answer_size != 4 + kRpcCapsBytes || !recv_all(fd, answer + 8, 4 + kRpcCapsBytes, kConnectTimeoutMs, &timed_out)) {
        return endpoint + " gave no RPC handshake answer of this protocol: it is not an rpc-server of this build";
    }
    const int major = answer[8];
    if (major != RPC_PROTO_MAJOR_VERSION) {
        return "the rpc-server at " + endpoint + " speaks RPC protocol " + std::to_string(major) + ", this build " +
               std::to_string(RPC_PROTO_MAJOR_VERSION) + " (a stock llama.cpp rpc-server does not know the paged " +
               "attention op: run `cacheflow rpc-server` there)";
    }
    return "";
}

// Every numeric address:port host:port resolves to ("127.0.0.1:50052"), none when it does not resolve
// (to tell two names of one server apart; the probe reports the resolution error).
std::vector<std::string> numeric_addresses(const std::string & host, const std::string & port) {
    std::vector<std::string> out;
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * addrs = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs) != 0) {
        return out;
    }
    for (addrinfo * a = addrs; a != nullptr; a = a->ai_next) {
        char numeric[NI_MAXHOST] = {};
        char service[NI_MAXSERV] = {};
        if (getnameinfo(a->ai_addr, a->ai_addrlen, numeric, sizeof(numeric), service, sizeof(service),
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
            out.push_back(std::string(numeric) + ":" + service);
        }
    }
    freeaddrinfo(addrs);
    return out;
}

// "" when host:port resolves, connects within the timeout and answers the RPC handshake (handshake), else
// why not.
std::string rpc_probe(const std::string & host, const std::string & port, const std::string & endpoint) {
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * addrs = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs); rc != 0) {
        return "cannot connect to rpc-server at " + endpoint + " (" + gai_strerror(rc) + ")";
    }
    std::string why = "no address";
    for (addrinfo * a = addrs; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            why = std::strerror(errno);
            continue;
        }
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            pollfd p = {fd, POLLOUT, 0};
            const int ready = ::poll(&p, 1, kConnectTimeoutMs);
            socklen_t len = sizeof(err);
            err = ready == 0 ? ETIMEDOUT : 0;
            if (ready > 0) {
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            }
        }
        if (err == 0) {
            std::string answer = handshake(fd, endpoint);
            ::close(fd);
            freeaddrinfo(addrs);
            return answer;
        }
        ::close(fd);
        why = std::strerror(err);
    }
    freeaddrinfo(addrs);
    return "cannot connect to rpc-server at " + endpoint + " (" + why + "); start one there with `cacheflow rpc-server " +
           "--host " + host + " --port " + port + "`";
}

using rpc_add_server_fn = ggml_backend_reg_t (*)(const char * endpoint);

rpc_add_server_fn rpc_add_server() {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    void * fn = rpc != nullptr ? ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server") : nullptr;
    if (fn == nullptr) {
        throw Error(CF_STATUS_UNSUPPORTED, "rpc_servers: this build has no RPC backend (built with CACHEFLOW_RPC=OFF)");
    }
    return (rpc_add_server_fn) fn;
}

bool is_rpc(ggml_backend_dev_t dev) {
    return std::strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0;
}

std::string known_devices() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            names += (names.empty() ? "" : ", ") + device_label(dev);
        }
    }
    return names.empty() ? "none (CPU only)" : names;
}

// llama.cpp's default device list (llama.cpp's llama_prepare_model_devices) with only this engine's
// RPC devices: those first, then the GPUs, else the integrated GPUs.
std::vector<ggml_backend_dev_t> default_devices(const std::vector<ggml_backend_dev_t> & rpc_devices) {
    std::vector<ggml_backend_dev_t> gpus;
    std::vector<ggml_backend_dev_t> igpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU && !is_rpc(dev)) {
            gpus.push_back(dev);
        } else if (type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            igpus.push_back(dev);
        }
    }
    std::vector<ggml_backend_dev_t> devs = rpc_devices;
    devs.insert(devs.end(), gpus.begin(), gpus.end());
    if (gpus.empty()) {
        devs.insert(devs.end(), igpus.begin(), igpus.end());
    }
    return devs;
}

std::vector<ggml_backend_dev_t> named_devices(const std::string & names,
                                              const std::vector<ggml_backend_dev_t> & rpc_devices) {
    std::vector<ggml_backend_dev_t> devs;
    if (names == "none") {
        return devs;
    }
    for (const std::string & name : split_list(names)) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            fail_invalid("devices: unknown device '" + name + "' (the CPU is always used; devices: " + known_devices() +
                         ")");
        }
        if (is_rpc(dev) && std::find(rpc_devices.begin(), rpc_devices.end(), dev) == rpc_devices.end()) {
            fail_invalid("devices: " + device_label(dev) + " is not a device of rpc_servers");
        }
        if (std::find(devs.begin(), devs.end(), dev) != devs.end()) {
            fail_invalid("devices: '" + name + "' is listed twice");
        }
        devs.push_back(dev);
    }
    return devs;
}

std::string labels(const std::vector<ggml_backend_dev_t> & devs) {
    std::string text;
    for (ggml_backend_dev_t dev : devs) {
        text += (text.empty() ? "" : ", ") + device_label(dev);
    }
    return text.empty() ? "none" : text;
}

}  // namespace

std::vector<ggml_backend_dev_t> DevicePlacement::offload_devices() const {
    return std::vector<ggml_backend_dev_t>(devices.begin(), devices.end() - 1);
}

std::string device_label(ggml_backend_dev_t dev) {
    return std::string(ggml_backend_dev_name(dev)) + " (" + ggml_backend_dev_description(dev) + ")";
}

// The devices ggml's registry already has for endpoint (registered by an earlier engine of the process).
static std::vector<ggml_backend_dev_t> registered_rpc_devices(const std::string & endpoint) {
    std::vector<ggml_backend_dev_t> devs;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (is_rpc(dev) && endpoint == ggml_backend_dev_description(dev)) {
            devs.push_back(dev);
        }
    }
    return devs;
}

std::vector<ggml_backend_dev_t> add_rpc_servers(const std::string & servers) {
    static std::mutex mutex;  // the registry is process-wide
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<ggml_backend_dev_t> devs;
    if (servers.empty()) {
        return devs;
    }
    rpc_add_server_fn add = rpc_add_server();
    const std::vector<std::string> endpoints = split_list(servers);
    std::string host;
    std::string port;
    for (const std::string & endpoint : endpoints) {
        parse_endpoint(endpoint, host, port);  // all well-formed before any is connected to
    }
    // No two endpoints name one server, and every new endpoint answers the RPC handshake, before ggml-rpc
    // connects to any: ggml-rpc waits forever for a server that does not answer (a busy one serves another
    // client) and would connect to one server twice under two names, the second connection waiting forever.
    std::vector<std::pair<std::string, std::vector<std::string>>> resolved;  // endpoint, its addresses
    for (const std::string & endpoint : endpoints) {
        parse_endpoint(endpoint, host, port);
        std::vector<std::string> addresses = numeric_addresses(host, port);
        for (const auto & [other, other_addresses] : resolved) {
            const bool same = other != endpoint && std::any_of(addresses.begin(), addresses.end(), [&](const std::string & a) {
                return std::find(other_addresses.begin(), other_addresses.end(), a) != other_addresses.end();
            });
            if (same) {
                fail_invalid("rpc_servers: " + other + " and " + endpoint + " name the same address (" + addresses[0] +
                             "): list each rpc-server once");
            }
        }
        resolved.emplace_back(endpoint, std::move(addresses));
    }
    std::vector<std::string> probed;
    for (const std::string & endpoint : endpoints) {
        if (std::find(probed.begin(), probed.end(), endpoint) != probed.end() || !registered_rpc_devices(endpoint).empty()) {
            continue;
        }
        parse_endpoint(endpoint, host, port);
        if (const std::string why = rpc_probe(host, port, endpoint); !why.empty()) {
            fail_invalid("rpc_servers: " + why);
        }
        probed.push_back(endpoint);
    }
    for (const std::string & endpoint : endpoints) {
        // ggml-rpc keeps one registry entry per endpoint; registering it twice would list its devices twice
        const std::vector<ggml_backend_dev_t> known = registered_rpc_devices(endpoint);
        if (!known.empty()) {
            for (ggml_backend_dev_t dev : known) {
                if (std::find(devs.begin(), devs.end(), dev) == devs.end()) {
                    devs.push_back(dev);
                }
            }
            continue;
        }
        ggml_backend_reg_t reg = add(endpoint.c_str());
        if (reg == nullptr || ggml_backend_reg_dev_count(reg) == 0) {
            fail_invalid("rpc_servers: the rpc-server at " + endpoint + " reports no device");
        }
        ggml_backend_register(reg);
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            devs.push_back(ggml_backend_reg_dev_get(reg, i));
        }
    }
    return devs;
}

DevicePlacement place_devices(const EngineConfig & config) {
    const std::vector<ggml_backend_dev_t> rpc_devices = add_rpc_servers(config.rpc_servers);
    std::vector<ggml_backend_dev_t> devs =
        config.devices.empty() ? default_devices(rpc_devices) : named_devices(config.devices, rpc_devices);
    if (config.split_mode == CF_SPLIT_MODE_NONE && !devs.empty()) {
        if (config.main_gpu >= (int32_t) devs.size()) {
            fail_invalid("main_gpu (" + std::to_string(config.main_gpu) + ") must be below the number of devices (" +
                         std::to_string(devs.size()) + ": " + labels(devs) + ")");
        }
        // llama.cpp keeps only the main device with split mode none; the engine does the same up front
        // so that it asks the right devices about the paged attention op
        devs = config.main_gpu < 0 ? std::vector<ggml_backend_dev_t>{} : std::vector<ggml_backend_dev_t>{devs[config.main_gpu]};
    }
    DevicePlacement placement;
    if (!config.tensor_split.empty()) {
        if (config.tensor_split.size() > std::max<size_t>(devs.size(), 1)) {
            fail_invalid("tensor_split has " + std::to_string(config.tensor_split.size()) + " proportions for " +
                         std::to_string(devs.size()) + " devices (" + labels(devs) + ")");
        }
        placement.tensor_split.assign(llama_max_devices(), 0.0f);
        std::copy(config.tensor_split.begin(), config.tensor_split.end(), placement.tensor_split.begin());
    }
    placement.devices = devs;
    placement.devices.push_back(nullptr);
    return placement;
}

std::vector<cf_device_info> list_devices(const std::string & rpc_servers) {
    const std::vector<ggml_backend_dev_t> rpc_devices = add_rpc_servers(rpc_servers);
    std::vector<cf_device_info> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (is_rpc(dev) && std::find(rpc_devices.begin(), rpc_devices.end(), dev) == rpc_devices.end()) {
            continue;  // another engine's server, maybe gone: asking it its memory would abort if so
        }
        cf_device_info info = {};
        std::snprintf(info.name, sizeof(info.name), "%s", ggml_backend_dev_name(dev));
        std::snprintf(info.description, sizeof(info.description), "%s", ggml_backend_dev_description(dev));
        info.type = (int32_t) ggml_backend_dev_type(dev);
        size_t free_bytes = 0;
        size_t total_bytes = 0;
        ggml_backend_dev_memory(dev, &free_bytes, &total_bytes);
        info.memory_total_bytes = (int64_t) total_bytes;
        info.memory_free_bytes = (int64_t) free_bytes;
        out.push_back(info);
    }
    return out;
}

}  // namespace cf

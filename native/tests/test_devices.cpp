// test_devices.cpp - device placement of the engine config (engine/devices.h) without a server: the
// messages of malformed and unreachable RPC endpoints, unknown device names, split mode none and a
// tensor split longer than the device list. (Two live rpc-servers: tests/e2e/test_rpc_split.py.)
#undef NDEBUG  // the checks must run in Release builds too
#include "engine/devices.h"

#include "core/error.h"
#include "llama.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cassert>
#include <cstdio>
#include <string>

namespace {

// The message of the cf::Error that fn throws ("" if none), checking its status.
template <typename Fn> std::string error_of(Fn fn, cf_status status = CF_STATUS_INVALID_ARGUMENT) {
    try {
        fn();
    } catch (const cf::Error & e) {
        assert(e.status() == status);
        return e.what();
    }
    return "";
}

bool starts_with(const std::string & text, const std::string & prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

// A local TCP port nobody listens on (bound, then closed).
int closed_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, (sockaddr *) &addr, sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd, (sockaddr *) &addr, &len);
    ::close(fd);
    return ntohs(addr.sin_port);
}

void test_malformed_and_unreachable_endpoints_name_rpc_servers() {
    for (const char * bad : {"localhost", ":50052", "h:0", "h:65536", "h:12x", "a:1,,b:2"}) {
        const std::string why = error_of([&] { cf::add_rpc_servers(bad); });
        std::printf("  %s: %s\n", bad, why.c_str());
        assert(starts_with(why, "rpc_servers: '"));
    }
    const std::string endpoint = "127.0.0.1:" + std::to_string(closed_port());
    const std::string why = error_of([&] { cf::add_rpc_servers(endpoint); });
    std::printf("  %s\n", why.c_str());
    assert(starts_with(why, "rpc_servers: cannot connect to rpc-server at " + endpoint + " ("));
    assert(cf::add_rpc_servers("").empty());
}

void test_placement_without_servers() {
    cf::EngineConfig config;
    const cf::DevicePlacement all = cf::place_devices(config);  // a CPU build: no GPU, only the terminator
    assert(!all.devices.empty() && all.devices.back() == nullptr && all.tensor_split.empty());
    config.devices = "none";
    assert(cf::place_devices(config).offload_devices().empty());
    config.devices = "GPU7";
    const std::string unknown = error_of([&] { cf::place_devices(config); });
    std::printf("  %s\n", unknown.c_str());
    assert(starts_with(unknown, "devices: unknown device 'GPU7'"));
    config.devices = "";
    config.split_mode = CF_SPLIT_MODE_NONE;
    config.main_gpu = -1;
    assert(cf::place_devices(config).offload_devices().empty());
    config.split_mode = CF_SPLIT_MODE_LAYER;
    config.tensor_split = {1.0f, 1.0f};
    const std::string split = error_of([&] { cf::place_devices(config); });
    assert(all.offload_devices().size() >= 2 || starts_with(split, "tensor_split has 2 proportions for "));
    config.tensor_split = {1.0f};
    assert(cf::place_devices(config).tensor_split.size() == llama_max_devices());
}

}  // namespace

int main() {
    test_malformed_and_unreachable_endpoints_name_rpc_servers();
    test_placement_without_servers();
    std::printf("test_devices: ok\n");
    return 0;
}

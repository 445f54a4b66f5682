// devices.h - which devices a model's layers (and their KV caches) go to: RPC servers, device names,
// split mode, main device and tensor split (cf_engine_config's device fields, llama-server's --rpc,
// -dev, -sm, -mg, -ts).
//
// llama.cpp's layer split puts each offloaded layer's weights and KV cache on one device; in paged
// mode that layer's K/V pools live there too and its paged attention node runs there, while the one
// block table of the engine (block ids are shared by all layers) serves every device. RPC servers
// (rpc-server processes of this build, local or remote) are devices of ggml's RPC backend named
// "RPC<n>" in the order they were registered in the process, described by their "host:port".
#pragma once

#include "engine/config.h"
#include "ggml-backend.h"

#include <string>
#include <vector>

namespace cf {

// The model's device placement, in llama_model_params' terms. Owns the arrays the params point into:
// keep it alive until llama_model_load_from_file returns.
struct DevicePlacement {
    std::vector<ggml_backend_dev_t> devices;  // offload devices in layer order, then nullptr (may be just nullptr)
    std::vector<float> tensor_split;          // llama_max_devices() proportions, or empty (by free memory)

    // The offload devices, without the terminating nullptr.
    std::vector<ggml_backend_dev_t> offload_devices() const;
};

// Register each "host:port" of the comma-separated servers with ggml's RPC backend, once per process
// and endpoint (a second engine with the same server reuses its devices). Each new endpoint is first
// probed with a TCP connect (5 s timeout), since ggml-rpc aborts the process when it cannot connect.
// Returns the devices of these servers in the order given. Throws INVALID_ARGUMENT naming rpc_servers
// for a malformed endpoint, an unreachable one (with the system's reason) or a server that reports no
// device, UNSUPPORTED when the build has no RPC backend. Not thread-safe against a concurrent call
// with a new endpoint (engines are created one at a time).
std::vector<ggml_backend_dev_t> add_rpc_servers(const std::string & servers);

// The placement of config's fields: rpc_servers registered, the device names resolved (an unknown
// name, or one of an RPC server not in rpc_servers, is INVALID_ARGUMENT naming devices and listing the
// known ones), main_gpu checked against the devices in use with split_mode none, tensor_split checked
// against their number. Without device names: the RPC devices of rpc_servers, then every GPU (or, with
// none, every integrated GPU): llama.cpp's default order, minus RPC servers other engines of the
// process registered.
DevicePlacement place_devices(const EngineConfig & config);

// The devices of the process after registering rpc_servers (as add_rpc_servers), CPU first: the local
// ones and those of rpc_servers (not other RPC servers registered earlier in the process).
std::vector<cf_device_info> list_devices(const std::string & rpc_servers);

// "RPC0 (127.0.0.1:50052)" style name and description of dev.
std::string device_label(ggml_backend_dev_t dev);

}  // namespace cf

"""Device flags of generate, bench and serve, spelled as llama-server spells them: --rpc, -dev/--device,
-sm/--split-mode, -ts/--tensor-split, -mg/--main-gpu, --list-devices; and ``cacheflow rpc-server``.

llama.cpp's layer split puts each offloaded layer's weights and KV cache on one device (a GPU, or an
rpc-server process of this build, local or on another host); in paged mode each device holds the K/V
pools of its own layers and the engine's one block table serves them all (README "Several devices").
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

# EngineConfig field -> the flag that sets it, for the engine's messages (cli/common.py load_llm)
DEVICE_OPTION_NAMES = {
    "rpc_servers": "--rpc",
    "devices": "-dev/--device",
    "split_mode": "-sm/--split-mode",
    "main_gpu": "-mg/--main-gpu",
    "tensor_split": "-ts/--tensor-split",
}
# EngineConfig field -> the click parameter of that flag
DEVICE_PARAMS = {
    "rpc_servers": "rpc",
    "devices": "device",
    "split_mode": "split_mode",
    "main_gpu": "main_gpu",
    "tensor_split": "tensor_split",
}
_SPLIT_MODE_HELP = (
    "How the offloaded layers spread over the devices: layer (each layer, its weights and KV "
    "cache, on one device; the default) or none (all on -mg). row and tensor are not supported."
)


def device_options(command: F) -> F:
    """Add the device flags to a click command (their values reach it as ``options``)."""
    for option in reversed(
        (
            click.option("--rpc", "rpc", metavar="SERVERS", envvar="LLAMA_ARG_RPC",
                         help="Comma-separated host:port of rpc-server processes (`cacheflow "
                         "rpc-server`) to put layers on; their devices come first (RPC0, RPC1, "
                         "...). Implies all layers offloaded unless the layer count is given."),
            click.option("-dev", "--device", "device", metavar="DEV1,DEV2",
                         help="Comma-separated devices to offload to, in layer order (none = no "
                         "offload); --list-devices names them."),
            click.option("--list-devices", is_flag=True,
                         help="Print the devices (with those of --rpc) and exit."),
            click.option("-sm", "--split-mode", "split_mode",
                         type=click.Choice(["none", "layer", "row", "tensor"]), default="layer",
                         show_default=True, help=_SPLIT_MODE_HELP),
            click.option("-ts", "--tensor-split", "tensor_split", metavar="N0,N1,...",
                         help="Proportion of the layers per device, e.g. 3,1."),
            click.option("-mg", "--main-gpu", "main_gpu", type=int, default=0, show_default=True,
                         help="With -sm none: index of the device that gets the model."),
        )
    ):  # fmt: skip
        command = option(command)
    return command


def device_kwargs(options: dict[str, object]) -> dict[str, object]:
    """EngineConfig fields of the device flags (flags the user left at their defaults are left out).

    Raises:
        click.BadParameter: a malformed -ts, an empty --rpc or -dev entry, -sm row or tensor.
    """
    kwargs: dict[str, object] = {}
    split_mode = str(options["split_mode"])
    if split_mode in ("row", "tensor"):
        raise click.BadParameter(
            f"{split_mode} split is not supported: llama.cpp's {split_mode} split needs ggml-cuda's "
            "split buffers, and the paged KV pools are per layer; use -sm layer",
            param_hint="-sm/--split-mode",
        )
    if split_mode != "layer":
        kwargs["split_mode"] = split_mode
    if int(options["main_gpu"]) != 0:
        kwargs["main_gpu"] = int(options["main_gpu"])
    if options["rpc"]:
        kwargs["rpc_servers"] = _names(str(options["rpc"]), "--rpc")
    if options["device"]:
        kwargs["devices"] = _names(str(options["device"]), "-dev/--device")
    if options["tensor_split"]:
        kwargs["tensor_split"] = parse_tensor_split(str(options["tensor_split"]))
    return kwargs


def parse_tensor_split(value: str) -> tuple[float, ...]:
    """-ts "3,1" (or "3/1", as llama-server reads it) as proportions; ranges are the engine's."""
    parts = [p for p in re.split(r"[,/]+", value.strip()) if p.strip()]
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated numbers, e.g. 3,1; got {value!r}", param_hint="-ts/--tensor-split"
        ) from None
    if not numbers:
        raise click.BadParameter("expected at least one number", param_hint="-ts/--tensor-split")
    return numbers


def _names(value: str, flag: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(","))
    if not all(names):
        raise click.BadParameter(f"an empty entry in {value!r}", param_hint=flag)
    return names


def list_devices_and_exit(options: dict[str, object]) -> None:
    """--list-devices: print the devices as llama-server does and exit 0 (does nothing without it).

    Raises:
        click.UsageError: an unreachable or malformed --rpc server.
    """
    if not options.get("list_devices"):
        return
    from pycacheflow._native import list_devices
    from pycacheflow.errors import CacheFlowError

    servers = _names(str(options["rpc"]), "--rpc") if options["rpc"] else ()
    try:
        devices = list_devices(servers)
    except CacheFlowError as exc:
        raise click.UsageError(f"Invalid value for --rpc: {exc}") from None
    click.echo("Available devices:")
    offload = [d for d in devices if d.type != 0]  # the CPU always runs what is not offloaded
    if not offload:
        click.echo("  (none)")
    for d in offload:
        mib = 1 << 20
        click.echo(f"  {d.name}: {d.description} ({d.memory_total_bytes // mib} MiB, "
                   f"{d.memory_free_bytes // mib} MiB free)")  # fmt: skip
    sys.exit(0)


def rpc_server_path() -> Path:
    """The rpc-server executable installed next to libcacheflow.so (pycacheflow/lib/, as
    ``pycacheflow._ffi.library_path`` finds it); $CACHEFLOW_RPC_SERVER overrides it."""
    from pycacheflow._ffi import library_path

    override = os.environ.get("CACHEFLOW_RPC_SERVER")
    if override:
        return Path(override)
    return library_path().parent / "rpc-server"


@click.command(
    "rpc-server",
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def rpc_server(args: tuple[str, ...]) -> None:
    """Run llama.cpp's rpc-server of this build: a process whose devices (its CPU, or its GPUs in a
    CUDA build) hold and compute layers for a `--rpc host:port` engine elsewhere.

    \b
    Its own flags follow (-H/--host, -p/--port, -t/--threads, -d/--device, -c/--cache; -h lists
    them). It serves one engine at a time and must come from this build: its protocol carries
    CacheFlow's paged attention op, and a stock llama.cpp rpc-server fails the handshake
    ("RPC server version mismatch", and ggml-rpc aborts the engine).
    Example, two servers on one machine and an engine splitting its layers over them:
      cacheflow rpc-server -p 50052 &  cacheflow rpc-server -p 50053 &
      cacheflow generate --rpc 127.0.0.1:50052,127.0.0.1:50053 "Hello"
    """
    path = rpc_server_path()
    if not path.is_file():
        raise click.ClickException(
            f"rpc-server is not installed at {path} (a build with CACHEFLOW_RPC=OFF?)"
        )
    os.execv(str(path), [str(path), *args])

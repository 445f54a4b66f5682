"""``cacheflow serve --data-parallel N``: N engine replicas behind one router (issue 17).

Each replica is a ``cacheflow serve`` child process with the same arguments, on 127.0.0.1 and a
port of its own (--port 0: the child prints the one it got), started in a session of its own
and with PR_SET_PDEATHSIG (Linux), so it gets SIGTERM if the router dies without cleaning up.
On a machine with GPUs replica i sees only GPU i (CUDA_VISIBLE_DEVICES; replicas share GPUs
round-robin when there are fewer GPUs than replicas); without -t, the CPU cores are split
between the replicas (each gets cores // N threads, at least 1). The router
(pycacheflow/server/router.py) listens on the public --host/--port.

Shutdown (SIGINT/SIGTERM): the router stops accepting, sends SIGTERM to every replica (each
finishes or aborts its requests within --shutdown-timeout, and those answers still stream
through), waits for them to exit and kills any still running after the timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from cli.serve import _FLUSH_S, _POLL_S, _hosts, _listen_all, _url_host

if TYPE_CHECKING:
    import socket

    import uvicorn

    from pycacheflow.server.router import Router

RAW_ARGS_KEY = "cacheflow.serve.raw_args"  # click context meta: the arguments as given
START_TIMEOUT_S = 600.0  # for one replica to load its model and answer GET /health
STOP_EXTRA_S = 10.0  # after --shutdown-timeout, before a replica still running is killed
# Flags of the router alone (with their number of values), not passed to the replicas.
ROUTER_FLAGS = {"-dp": 1, "--data-parallel": 1, "--router-policy": 1, "--router-slack": 1,
                "--host": 1, "--port": 1}  # fmt: skip
_URL_LINE = re.compile(r"cacheflow serve: (http://\S+)")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def replica_args(raw_args: Sequence[str]) -> list[str]:
    """The serve arguments as given, less the router's own flags (``ROUTER_FLAGS``, also in
    ``--flag=value`` form)."""
    args, skip = [], 0
    for arg in raw_args:
        if skip:
            skip -= 1
        elif arg in ROUTER_FLAGS:
            skip = ROUTER_FLAGS[arg]
        elif not (arg.startswith("--") and arg.partition("=")[0] in ROUTER_FLAGS):
            args.append(arg)
    return args


def gpu_ids() -> list[str]:
    """The GPUs replicas may use: CUDA_VISIBLE_DEVICES's list when set, else one per line of
    ``nvidia-smi -L``; [] on a machine without NVIDIA GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


class ReplicaProcess:
    """One replica: ``python -m cli serve ARGS --host 127.0.0.1 --port 0`` whose output lines are
    copied to our stderr as ``[replica i] ...``.

    Args:
        replica_id: 0-based index.
        args: serve arguments (``replica_args``, plus the model and threads).
        env: its environment.
    """

    def __init__(self, replica_id: int, args: list[str], env: dict[str, str]) -> None:
        self.replica_id = replica_id
        self.base_url: str | None = None
        self._url_seen = threading.Event()
        cmd = [sys.executable, "-m", "cli", "serve", *args, "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip

    def start_copying_output(self) -> None:
        """Copy its output to our stderr from a daemon thread (after every replica started:
        no thread runs while another replica is forked)."""
        threading.Thread(target=self._copy_output, daemon=True).start()

    def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            match = _URL_LINE.search(line)
            if match and self.base_url is None:
                self.base_url = match.group(1)
                self._url_seen.set()
            sys.stderr.write(f"[replica {self.replica_id}] {line}\n")
        self._url_seen.set()  # exited: stop waiting

    def wait_ready(self, deadline: float) -> str:
        """Wait until it serves (its URL line, then GET /health 200); returns its base URL.

        Raises:
            click.ClickException: it exited, or ``deadline`` (time.monotonic()) passed.
        """
        import httpx

        self._url_seen.wait(max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise click.ClickException(
                    f"replica {self.replica_id} exited with status {self.proc.returncode} while "
                    "starting (its output is above)"
                )
            if self.base_url is not None:
                try:
                    if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                        return self.base_url
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise click.ClickException(
            f"replica {self.replica_id} did not start within {START_TIMEOUT_S:.0f} s"
        )

    def terminate(self) -> None:
        """Send SIGTERM (if it still runs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for its exit until ``deadline`` (time.monotonic()), then SIGKILL it."""
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _die_with_parent() -> None:
    """In the forked child: ask Linux for SIGTERM when the router (its parent) dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the router's own shutdown still stops the replicas


def serve_data_parallel(options: dict[str, object], raw_args: Sequence[str]) -> None:
    """Run ``options["data_parallel"]`` replicas and the router until SIGINT/SIGTERM.

    Args:
        options: the parsed serve options.
        raw_args: the serve arguments as given (the replicas get them, less ROUTER_FLAGS).

    Raises:
        click.ClickException: the public port is taken or a replica did not start (exit 1).
    """
    num_replicas = int(options["data_parallel"])
    socks = _listen_all(_hosts(str(options["host"])), int(options["port"]))
    replicas: list[ReplicaProcess] = []
    try:
        replicas = _start_replicas(num_replicas, options, raw_args)
        deadline = time.monotonic() + START_TIMEOUT_S
        urls = [r.wait_ready(deadline) for r in replicas]
        _run_router(replicas, urls, socks, options)
    finally:
        for replica in replicas:
            replica.terminate()
        deadline = time.monotonic() + float(options["shutdown_timeout"]) + STOP_EXTRA_S
        for replica in replicas:
            replica.wait_or_kill(deadline)
        for sock in socks:
            sock.close()


def _default_threads() -> int:
    """The engine's default thread count (one per physical core; cf_default_threads); the CPUs this process may
    use if the native library cannot say (the router itself never needs it otherwise)."""
    try:
        from pycacheflow import _native

        return _native.default_threads()
    except (ImportError, OSError, AttributeError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _start_replicas(
    num_replicas: int, options: dict[str, object], raw_args: Sequence[str]
) -> list[ReplicaProcess]:
    args = replica_args(raw_args)
    if options["model"] is None:  # resolve (and download) the default model once, not N times
        args += ["-m", str(_default_model(bool(options["offline"])))]
    if int(options["threads"]) <= 0:  # -1 or 0: the engine's default count, split between the replicas
        args += ["-t", str(max(1, _default_threads() // num_replicas))]
    gpus = gpu_ids()
    if gpus and len(gpus) < num_replicas:
        click.echo(f"cacheflow serve: {num_replicas} replicas on {len(gpus)} GPU(s): replicas "
                   "share GPUs round-robin", err=True)  # fmt: skip
    replicas = []
    for i in range(num_replicas):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        replicas.append(ReplicaProcess(i, args, env))
    for replica in replicas:
        replica.start_copying_output()
    return replicas


def _default_model(offline: bool) -> object:
    from cli.serve import _cached_default_model

    if offline:
        return _cached_default_model()
    from pycacheflow.errors import CacheFlowError
    from pycacheflow.model_hub import ensure_default_model

    try:
        return ensure_default_model(progress=True)
    except CacheFlowError as exc:  # e.g. a cache folder that cannot be created
        raise click.ClickException(str(exc)) from None


def _run_router(
    replicas: list[ReplicaProcess],
    urls: list[str],
    socks: list[socket.socket],
    options: dict[str, object],
) -> None:
    import uvicorn

    from pycacheflow.server.http_protocol import protocol_class
    from pycacheflow.server.router import Replica, Router, RouterConfig
    from pycacheflow.server.router_app import create_router_app

    verbose = bool(options["verbose"])
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    api_keys = tuple(k.strip() for k in str(options["api_key"] or "").split(",") if k.strip())
    config = RouterConfig(policy=str(options["router_policy"]),
                          slack=int(options["router_slack"]),
                          enable_metrics=bool(options["enable_metrics"]), api_keys=api_keys,
                          max_body_bytes=int(options["max_body_size"]))
    router = Router(
        [Replica(r.replica_id, url, r.proc.pid, r.proc.poll) for r, url in zip(replicas, urls)],
        config,
    )  # fmt: skip
    grace_s = float(options["shutdown_timeout"])
    server = uvicorn.Server(uvicorn.Config(
        create_router_app(router),
        timeout_keep_alive=int(options["timeout"]),
        # the replicas end their requests within grace_s, then their answers stream through
        timeout_graceful_shutdown=grace_s + 2 * _FLUSH_S,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        lifespan="off",
        http=protocol_class(),
    ))  # fmt: skip
    for sig in (signal.SIGINT, signal.SIGTERM):  # see cli/serve.py's _run
        signal.signal(sig, lambda *_: None)
    public = [f"http://{_url_host(s.getsockname()[0])}:{s.getsockname()[1]}" for s in socks]
    click.echo(f"cacheflow serve: {' '.join(public)} ({len(replicas)} replicas, --router-policy "
               f"{config.policy}; Ctrl-C to stop)", err=True)  # fmt: skip
    asyncio.run(_serve(server, socks, router, replicas))
    if not server.started:
        sys.exit(1)


async def _serve(
    server: uvicorn.Server,
    socks: list[socket.socket],
    router: Router,
    replicas: list[ReplicaProcess],
) -> None:
    router.start_monitors()
    watcher = asyncio.create_task(_stop_replicas_on_exit(server, router, replicas))
    try:
        await server.serve(sockets=socks)
    finally:
        watcher.cancel()
        await router.close()


async def _stop_replicas_on_exit(
    server: uvicorn.Server, router: Router, replicas: list[ReplicaProcess]
) -> None:
    """Once shutdown began, pass SIGTERM on to the replicas (they drain their requests)."""
    while not server.should_exit:
        await asyncio.sleep(_POLL_S)
    router.shutting_down = True
    for replica in replicas:
        replica.terminate()

"""The picker's gRPC server: Envoy's ``ExternalProcessor`` service and gRPC health.

Health (the gRPC Health Checking Protocol, services named by the endpoint picker protocol):
``liveness`` is ``SERVING`` while the process answers; ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` are ``SERVING`` once the runtime started
(pools known, probes and routing running) and ``NOT_SERVING`` from the start of a shutdown,
so the data plane stops sending new requests before the streams in flight are drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gateway.picker.decide import Picker
from gateway.picker.runtime import PickerRuntime
from gateway.picker.stream import OutOfOrder, PickerStream
from gateway.protocols.messages.protocol import CountTokensProtocol, MessagesProtocol
from gateway.protocols.openai.chat import ChatProtocol, CompletionsProtocol

log = logging.getLogger("speedgate.picker")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("readiness", EXT_PROC_SERVICE)


def picker_protocols() -> dict[str, Any]:
    """The client APIs a picker decides for, by path. Not the Responses API: its state
    (``previous_response_id``) is the proxy's, kept from the answers it relays."""
    protocols = [ChatProtocol(), CompletionsProtocol(), MessagesProtocol(),
                 CountTokensProtocol()]
    return {p.path: p for p in protocols}


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    """``Process``: one ``PickerStream`` per HTTP request."""

    def __init__(self, picker: Picker) -> None:
        self.picker = picker

    async def Process(
        self, request_iterator: AsyncIterator[ep.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep.ProcessingResponse]:
        """Answer the messages of one stream (``gateway.picker.stream``); a message out of
        the stream's order ends it with ``FAILED_PRECONDITION``."""
        try:
            async for out in PickerStream(self.picker).run(request_iterator):
                yield out
        except OutOfOrder as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))


class PickerServer:
    """The gRPC server of one picker over ``runtime``; ``port`` is the bound one after
    ``start`` (``port`` 0: the kernel picks)."""

    def __init__(self, runtime: PickerRuntime, host: str, port: int,
                 max_endpoints: int = 1) -> None:
        self.runtime = runtime
        self.picker = Picker(runtime, picker_protocols(), max_endpoints=max_endpoints)
        self.health = HealthServicer()
        self.server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.picker),
                                                        self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")

    async def start(self) -> None:
        """Start the runtime, then serve; readiness turns ``SERVING``."""
        await self.health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        await self.runtime.start()
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """Readiness ``NOT_SERVING``, streams in flight given ``grace_s`` seconds, then the
        runtime stopped."""
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)
        await self.runtime.stop()


async def serve_picker(
    runtime: PickerRuntime, host: str, port: int, port_file: str | None = None,
    max_endpoints: int = 1,
) -> None:
    """Run a picker over ``runtime`` until SIGTERM or SIGINT; writes the bound port to
    ``port_file`` once serving (how tests and scripts find it with ``port`` 0)."""
    from engines.procs import write_port_file

    config = runtime.config
    server = PickerServer(runtime, host, port, max_endpoints)
    await server.start()
    log.info("speedgate picker serving ext_proc on %s:%d", host, server.port)
    if port_file:
        write_port_file(port_file, server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(config.server.graceful_shutdown_s)

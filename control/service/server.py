"""Running the service: bind a socket (with a clear error when the port is taken), serve with uvicorn.

``serve`` blocks until SIGINT/SIGTERM (the CLI, ``specctl control-plane``).
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from control.errors import SpecctlError

GRACEFUL_SHUTDOWN_S = 2  # what still runs this long after a shutdown signal is cancelled


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port); SpecctlError says what to do if it fails."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SpecctlError(f"host '{host}' does not resolve ({e.strerror}); use an address of this machine, "
                           "e.g. 127.0.0.1") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SpecctlError(f"port {port} on {host} is already in use; choose another with --port "
                               "(or stop the process that holds it)") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise SpecctlError(f"host '{host}' is not an address of this machine; use e.g. 127.0.0.1") from None
        if e.errno == errno.EACCES:
            raise SpecctlError(f"no permission to listen on port {port}; use a port >= 1024") from None
        raise SpecctlError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app, log_level: str):
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            _close_streams(app)

    config = uvicorn.Config(getattr(app.state, "asgi", app), log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, proxy_headers=False)
    return Server(config)


def _close_streams(app) -> None:
    """Plan streams never end by themselves: end them so a shutdown does not wait for them."""
    hub = getattr(app.state, "hub", None)
    if hub is not None:
        hub.close_threadsafe()


def serve(app, sock: socket.socket, *, log_level: str = "warning") -> None:
    """Serve ``app`` on the bound ``sock`` until SIGINT/SIGTERM."""
    _server(app, log_level).run(sockets=[sock])


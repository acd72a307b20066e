"""The connection check: one WhoAmI round trip before any work, and what to fix when it fails.

    who = client.check(run_id="run-7", policy="my-policy")   # ExchangeClient, SchedulerClient, AlignClient

The call (identity.proto) proves in one round trip that the address answers gRPC, that TLS is as
configured, that the token is known, and that its principal may act as `policy` in `run_id`. A failure
raises the `mrl.errors` class of its status (Unavailable, Unauthenticated, PermissionDenied, ...) with
one message naming the service, the address, plaintext or TLS, where the token came from, and, when
the address did not answer gRPC as configured, what a probe of it found:

    probe (TCP connect, then a TLS handshake with ALPN h2/http-1.1, then an HTTP/2 preface in plaintext)
    refused                          "nothing listens on HOST:PORT"
    TLS, ALPN h2, client plaintext   "this looks like TLS: ... pass its CA"
    TLS, no ALPN h2                  "this is the REST port (HTTPS) ..."
    plaintext, answers "HTTP/1."     "this is the REST port (HTTP) ..."
    plaintext HTTP/2, client TLS     "the service speaks plaintext ..."

A service older than WhoAmI (UNIMPLEMENTED) passes: it answered gRPC, which is all it can prove.
"""
import socket
import ssl

import grpc

from mrl.v1 import identity_pb2 as ipb

__all__ = ["CHECK_TIMEOUT_S", "check", "check_request", "checked", "diagnose"]

CHECK_TIMEOUT_S = 10.0   # the connection check's deadline
PROBE_TIMEOUT_S = 3.0    # each socket step of the probe
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS
_SETTINGS = 0x04         # the HTTP/2 frame type a gRPC server answers the preface with


def _host_port(target: str) -> tuple[str, int] | None:
    host, _, port = target.rpartition(":")
    if not port.isdigit() or not host or "/" in host:
        return None                # a resolver URI (dns:///, unix:...): not probed
    return host.strip("[]"), int(port)


def _speaks(host: str, port: int) -> str:
    """What answers at host:port: "refused", "unreachable", "tls-h2", "tls-http", "http", "h2" or "unknown"."""
    try:
        sock = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE   # only asks whether TLS is spoken
    context.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with context.wrap_socket(sock, server_hostname=host) as tls:
            return "tls-h2" if tls.selected_alpn_protocol() == "h2" else "tls-http"
    except (ssl.SSLError, OSError):
        pass
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as plain:
            plain.sendall(_H2_PREFACE)
            first = plain.recv(16)
    except OSError:
        return "unknown"
    if first.startswith(b"HTTP/"):
        return "http"
    return "h2" if len(first) >= 4 and first[3] == _SETTINGS else "unknown"


def diagnose(target: str, tls: bool) -> str:
    """What a probe of `target` says is wrong with reaching a gRPC service there, plaintext or `tls`; "" when the
    probe finds gRPC spoken as configured (the failure is elsewhere: a name, a certificate, a timeout)."""
    address = _host_port(target)
    if address is None:
        return ""
    found = _speaks(*address)
    if found == "refused":
        return f"nothing listens on {target}: is the service up, and is this its gRPC port?"
    if found == "unreachable":
        return f"{target} cannot be reached (no route, or a firewall)"
    if found == "tls-h2" and not tls:
        return ("this looks like TLS: the service speaks TLS and this client plaintext; pass its CA certificate "
                "(tls_root_cert=, or MRL_TLS_ROOT_CERT=ca.pem)")
    if found in ("tls-http", "http"):
        return (f"this is the REST port ({'HTTPS' if found == 'tls-http' else 'HTTP'}), not gRPC: use the service's "
                f"gRPC port (`port`, not `admin_port`)")
    if found == "h2" and tls:
        return ("the service speaks plaintext and this client TLS: drop the CA (tls_root_cert / MRL_TLS_ROOT_CERT), "
                "or start the service with tls_cert and tls_key")
    if found == "tls-h2":
        return ("the TLS handshake failed: the CA given does not sign the service's certificate, or the certificate "
                "does not name this host")
    return ""


def check_request(run_id: str = "", policy: str = "") -> ipb.WhoAmIRequest:
    return ipb.WhoAmIRequest(run_id=run_id, policy=policy)


def checked(connection, exc: grpc.RpcError) -> ipb.WhoAmIResponse:
    """A failed connection check as its `mrl.errors` class, the probe's finding added; a service too old for WhoAmI
    (UNIMPLEMENTED) passes with an empty answer."""
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return ipb.WhoAmIResponse()
    unreached = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    raise connection.error(exc, diagnose(connection.target, connection.tls) if unreached else "") from exc


def check(connection, method, run_id: str = "", policy: str = "") -> ipb.WhoAmIResponse:
    """The blocking connection check through `method` (a stub's WhoAmI): one call, no retry (module docstring)."""
    try:
        return method(check_request(run_id, policy), metadata=connection.metadata, timeout=CHECK_TIMEOUT_S)
    except grpc.RpcError as exc:
        return checked(connection, exc)

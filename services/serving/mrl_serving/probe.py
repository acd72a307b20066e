"""A container's liveness probe of its own gRPC server: the standard health check (grpc.health.v1), over TLS
when the service serves TLS.

    python -m mrl_serving.probe PORT [--service NAME] [--tls-name NAME]

By default it asks about the service "liveness", which a server answers SERVING for as long as it answers at all:
a Redis outage makes the exchange and the scheduler NOT_SERVING for their services and for "" (readiness), and a
restart would not bring Redis back. `--service ''` or a service's name asks for readiness instead.
Exits 0 when the server answers SERVING within the timeout, 1 otherwise (saying why). It reads the service's
own settings from the environment: with MRL_TLS_CERT set it connects over TLS, trusting MRL_TLS_ROOT_CERT (the
CA; default: the certificate itself, as for a self-signed one) and checking the certificate names --tls-name
(default: localhost). Kubernetes' own gRPC probe speaks plaintext only, hence this one (deploy/k8s).
"""
import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mrl_serving.grpc_service import LIVENESS

__all__ = ["check", "main"]


def check(port: int, service: str = LIVENESS, tls_name: str = "localhost", timeout_s: float = 3.0) -> str | None:
    """None when the server on localhost:port answers SERVING for `service`, else why not."""
    target = f"localhost:{port}"
    cert = os.environ.get("MRL_TLS_CERT")
    if cert:
        with open(os.environ.get("MRL_TLS_ROOT_CERT") or cert, "rb") as f:
            root = f.read()
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root),
                                      [("grpc.ssl_target_name_override", tls_name)])
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout_s)
        except grpc.RpcError as exc:
            return f"{target}: {exc.code().name} {exc.details()}"
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return None if serving else f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrl_serving.probe", description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--service", default=LIVENESS,
                        help=f"the service name to ask about (default: {LIVENESS}; '' for the server's readiness)")
    parser.add_argument("--tls-name", default="localhost", help="the name the server's certificate must hold")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    why = check(args.port, args.service, args.tls_name, args.timeout)
    if why is not None:
        print(f"not serving: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

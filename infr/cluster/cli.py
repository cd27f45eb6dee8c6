"""`infr cluster`: flags -> ClusterConfig -> the Ray Serve application (infr/cluster/app.py)."""

from __future__ import annotations

import argparse

from infr.errors import InfrError


def add_parser(sub) -> argparse.ArgumentParser:
    from infr.serve.server import _kv_size

    p = sub.add_parser(
        "cluster", help="serve models on a Ray cluster: an OpenAI-compatible ingress over N engine replicas",
        description="Each MODEL (as for `infr serve`; ALIAS=MODEL to serve it under another id, e.g. the same "
                    "file twice) gets --replicas engine replicas, each one infr engine on one GPU or on the "
                    "CPU; requests are routed by `model`, then by prompt prefix, then by load. Without "
                    "--address a local Ray cluster is started. Docs: docs/scale.md.")
    p.add_argument("models", nargs="*", metavar="MODEL", help="models to serve (default: the default offline model)")
    p.add_argument("--replicas", default="1", metavar="N|MIN:MAX",
                   help="engine replicas per model: a fixed number, or autoscaling bounds (default 1)")
    p.add_argument("--num-cpus", type=float, default=1.0, help="Ray CPUs per replica (default 1)")
    p.add_argument("--num-gpus", type=float, default=0.0,
                   help="Ray GPUs per replica: 1 puts each replica's engine on a GPU of its own (default 0)")
    p.add_argument("--address", default=None,
                   help="an existing Ray cluster (auto, HOST:PORT or ray://HOST:PORT); default: start a local one")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--api-key", default=None, help="require this key (Authorization: Bearer KEY)")
    p.add_argument("--ctx", type=int, default=4096, help="context per sequence (default 4096)")
    p.add_argument("--parallel", type=int, default=4, help="sequences each replica batches (default 4)")
    p.add_argument("--batch-tokens", type=int, default=512, help="tokens per engine step at most (default 512)")
    p.add_argument("--kv-size", type=_kv_size, default=None, help="KV cache per replica, as for infr serve")
    p.add_argument("--backend", default="auto", help="auto|cpu|gpu|dawn, per replica (default auto)")
    p.add_argument("--drain", type=float, default=20.0, help="seconds shutdown waits for requests in flight")
    return p


def config_from_args(args: argparse.Namespace):
    from infr.cluster.config import ClusterConfig, parse_model, parse_replicas

    lo, hi = parse_replicas(args.replicas)
    models = [parse_model(m) for m in (args.models or ["smollm2-135m"])]
    if not 0 < args.port < 65536:
        raise InfrError(f"--port must be 1..65535, got {args.port}")
    cfg = ClusterConfig(models=models, replicas=lo, max_replicas=hi, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                        ctx=args.ctx, parallel=args.parallel, batch_tokens=args.batch_tokens, kv_size=args.kv_size,
                        backend=args.backend, address=args.address, host=args.host, port=args.port,
                        api_key=args.api_key, drain_s=args.drain)
    cfg.check()
    return cfg


def cmd_cluster(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        raise InfrError(f"`infr cluster` needs the cluster extra: pip install 'infr[cluster]' ({e})") from None
    from infr.cluster.app import run

    run(config_from_args(args))
    return 0

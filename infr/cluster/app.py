"""The Ray Serve application of `infr cluster`, and running it on a local or an existing cluster.

Replica choice: a fixed number of replicas is deployed as one single-replica deployment per slot
(engine-M-I), so the ingress picks the replica itself, by prompt prefix and load, through that
slot's DeploymentHandle; Ray still places, health-checks and restarts each one. Ray Serve's own
routers pick among a deployment's replicas by queue length only, and its pluggable request router
is an alpha API; slots keep the choice explicit and testable. With autoscaling bounds a model is
one autoscaled deployment instead, routed by Ray (no prefix affinity: its replicas come and go)."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading

from infr.cluster.config import ClusterConfig
from infr.errors import InfrError

log = logging.getLogger("infr.cluster")


def build(cfg: ClusterConfig):
    """The bound application: the ingress over every model's replica slots."""
    from ray import serve

    from infr.cluster.ingress import Ingress
    from infr.cluster.replica import deployment

    cfg.check()
    handles: dict[str, list] = {}
    for mi, entry in enumerate(cfg.models):
        opts = dict(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, max_ongoing=cfg.max_ongoing, drain_s=cfg.drain_s)
        sc = cfg.serve_config(entry)
        if cfg.autoscaling:
            handles[entry.id] = [deployment(f"engine-{mi}", sc, replicas=cfg.replicas,
                                            max_replicas=cfg.max_replicas, upscale_delay_s=cfg.upscale_delay_s,
                                            downscale_delay_s=cfg.downscale_delay_s, look_back_s=cfg.look_back_s,
                                            **opts)]
        else:
            handles[entry.id] = [deployment(f"engine-{mi}-{i}", sc, **opts) for i in range(cfg.replicas)]
    ingress = serve.deployment(Ingress).options(
        name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000,
        graceful_shutdown_timeout_s=cfg.drain_s, graceful_shutdown_wait_loop_s=0.5)
    return ingress.bind(cfg, handles)


def connect(cfg: ClusterConfig) -> None:
    """Join cfg.address, or start a local Ray cluster sized for the replicas."""
    import ray

    if cfg.address:
        ray.init(address=cfg.address, log_to_driver=cfg.replica_logs)
        return
    per = max(cfg.replicas, cfg.max_replicas or 0) * len(cfg.models)
    cpus = cfg.local_cpus or max(os.cpu_count() or 1, int(per * cfg.num_cpus + 0.999))
    gpus = local_gpus(cfg, per)
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=cfg.object_store_mb * 2**20,
             log_to_driver=cfg.replica_logs, **({"num_gpus": gpus} if gpus is not None else {}))


def local_gpus(cfg: ClusterConfig, replicas: int) -> int | None:
    """GPUs a local Ray cluster advertises when its replicas ask for some (None: Ray's own count).
    Ray counts CUDA GPUs only, so a replica asking for one would wait forever on a host whose GPU
    Ray does not see (an AMD card, lavapipe): the cluster advertises what the replicas ask for at
    most (replicas x --num-gpus, rounded up), and the WebGPU adapters found where they are more.
    More asked for than found: replicas share adapters (replica.adapter_for), with a warning."""
    if cfg.num_gpus <= 0:
        return None
    if cfg.local_gpus is not None:
        return cfg.local_gpus
    need = math.ceil(replicas * cfg.num_gpus - 1e-9)
    if cfg.backend == "cpu":
        return need
    from infr.gpu.device import gpu_adapters

    found = len(gpu_adapters("dawn" if cfg.backend == "dawn" else "wgpu"))
    if not found and cfg.backend in ("gpu", "dawn"):
        raise InfrError(f"--num-gpus {cfg.num_gpus:g} --backend {cfg.backend}: no WebGPU adapter found "
                        "(install a Vulkan driver, e.g. mesa-vulkan-drivers; `infr devices` lists them)")
    if 0 < found < need:
        log.warning("%d replica(s) x %g GPU need %d GPUs; %d adapter(s) found: replicas share adapters",
                    replicas, cfg.num_gpus, need, found)
    return max(need, found)


def start(cfg: ClusterConfig) -> None:
    """Deploy on the connected cluster; returns once every replica has loaded its model."""
    from ray import serve

    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build(cfg), name=cfg.app_name, route_prefix="/")


def stop(cfg: ClusterConfig) -> None:
    """Drain: the application is deleted after requests in flight end (cfg.drain_s at most each)."""
    from ray import serve

    serve.delete(cfg.app_name)
    serve.shutdown()


def run(cfg: ClusterConfig) -> None:
    import ray

    logging.basicConfig(level=logging.INFO, format="infr: %(message)s")
    cfg.check()
    connect(cfg)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        start(cfg)
        shape = (f"{cfg.replicas}..{cfg.max_replicas} autoscaled" if cfg.autoscaling else str(cfg.replicas))
        log.info("serving %s (%s replica(s) each, %g CPU / %g GPU per replica) at http://%s:%d/v1",
                 ", ".join(m.id for m in cfg.models), shape, cfg.num_cpus, cfg.num_gpus, cfg.host, cfg.port)
        done.wait()
        log.info("draining (at most %gs)", cfg.drain_s)
        stop(cfg)
    finally:
        ray.shutdown()

"""`infr serve`: options (flags win over INFR_* variables) and the uvicorn process."""

from __future__ import annotations

import argparse
import logging
import os

from infr.errors import InfrError
from infr.kvpool import parse_kv_size

def _kv_size(text: str):
    """--kv-size: tokens or a fraction of free memory; a bad value is a usage error, not a traceback."""
    try:
        return parse_kv_size(text)
    except InfrError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# flag -> (INFR_* variable, type, default)
SERVE_OPTIONS = {
    "host": ("INFR_HOST", str, "127.0.0.1"),
    "port": ("INFR_PORT", int, 8080),
    "api_key": ("INFR_API_KEY", str, None),
    "ctx": ("INFR_CTX", int, 4096),
    "parallel": ("INFR_PARALLEL", int, 1),
    "batch_tokens": ("INFR_BATCH_TOKENS", int, 512),
    "kv_size": ("INFR_KV_SIZE", _kv_size, None),
    "backend": ("INFR_BACKEND", str, "auto"),
    "alias": ("INFR_MODEL_ALIAS", str, None),
    "cpu_moe": ("INFR_CPU_MOE", int, 0),
    "split_mode": ("INFR_SPLIT_MODE", str, None),  # none | layer (infr/split.py)
    "tensor_split": ("INFR_TENSOR_SPLIT", str, None),
}


_HELP = {
    "parallel": "sequences the engine runs at once (continuous batching) ",
    "batch_tokens": "tokens per engine step at most: decode rows plus prefill chunks (the GPU backends run 512 "
                    "at most: a larger budget is cut to that, and said at start) ",
    "cpu_moe": "keep the experts of the first N MoE layers in host memory, run on the CPU (llama.cpp's "
               "--n-cpu-moe) ",
    "split_mode": "one model across GPUs: none, or layer (contiguous layers per GPU), as llama.cpp's -sm ",
    "tensor_split": "each GPU's share of the layers, e.g. 3,1, as llama.cpp's -ts (implies --split-mode layer) ",
    "alias": "the model id clients see in /v1/models and every response's `model` (default: MODEL as given, "
             "or a GGUF path's file stem) ",
    "kv_size": "KV cache capacity shared by all sequences: tokens, or a fraction of the memory free after the "
               "weights (0.9 or 90%%) (default: ctx x parallel) ",
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="MODEL as for `infr run` (default: the default offline model).")
    p.add_argument("model", nargs="?", help="model to serve (env INFR_MODEL)")
    for name, (env, typ, default) in SERVE_OPTIONS.items():
        p.add_argument("--" + name.replace("_", "-"), type=typ, default=None,
                       metavar="NAME" if name == "alias" else None, help=f"{_HELP.get(name, '')}"
                       f"(env {env}; default {default})")
    p.add_argument("--strict-model", action="store_true", default=None,
                   help="answer 404 model_not_found to requests naming another model (default: serve any name, "
                        "as llama-server does) (env INFR_STRICT_MODEL=1)")
    p.add_argument("--device", type=int, default=None, help="GPU adapter number (env INFR_DEVICE)")
    return p


def config_from_args(args: argparse.Namespace):
    from infr.serve.service import Config

    opts = {}
    for name, (env, typ, default) in SERVE_OPTIONS.items():
        value = getattr(args, name, None)
        if value is None and os.environ.get(env) not in (None, ""):
            try:
                value = typ(os.environ[env])
            except ValueError:
                raise InfrError(f"{env}={os.environ[env]!r} is not a valid {typ.__name__}") from None
            except argparse.ArgumentTypeError as e:
                raise InfrError(f"{env}: {e}") from None
        opts[name] = default if value is None else value
    if opts["parallel"] < 1:
        raise InfrError(f"--parallel must be >= 1, got {opts['parallel']}")
    if opts["batch_tokens"] < opts["parallel"]:
        raise InfrError(f"--batch-tokens ({opts['batch_tokens']}) must be at least --parallel ({opts['parallel']})")
    if isinstance(opts["kv_size"], int) and opts["kv_size"] < 32:
        raise InfrError(f"--kv-size must be >= 32 tokens, got {opts['kv_size']}")
    if opts["cpu_moe"] < 0:
        raise InfrError(f"--cpu-moe must be >= 0, got {opts['cpu_moe']}")
    if opts["ctx"] < 16:
        raise InfrError(f"--ctx must be >= 16, got {opts['ctx']}")
    if not 0 <= opts["port"] <= 65535:
        raise InfrError(f"--port must be 0..65535, got {opts['port']}")
    from infr.split import SplitOptions

    split = SplitOptions.read(opts["split_mode"], opts["tensor_split"])
    model = args.model or os.environ.get("INFR_MODEL") or None
    strict = getattr(args, "strict_model", None)
    if strict is None:
        strict = os.environ.get("INFR_STRICT_MODEL", "").lower() in ("1", "true", "yes", "on")
    return Config(model=model, host=opts["host"], port=opts["port"], api_key=opts["api_key"], ctx=opts["ctx"],
                  parallel=opts["parallel"], batch_tokens=opts["batch_tokens"], kv_size=opts["kv_size"],
                  backend=opts["backend"], model_alias=opts["alias"], cpu_moe=opts["cpu_moe"],
                  strict_model=strict, split=split)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from infr.serve.app import create_app
    except ImportError as e:
        raise InfrError(f"`infr serve` needs the serve extra: pip install 'infr[serve]' ({e})") from None
    if getattr(args, "device", None) is not None:
        os.environ["INFR_DEVICE"] = str(args.device)
    config = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="infr: %(message)s")
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level="info", timeout_graceful_shutdown=3)
    return 0

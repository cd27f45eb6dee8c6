"""The `infr` command line. Errors a user can act on print one line, no traceback
(set INFR_DEBUG=1 for one)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from infr import cli_store, offline
from infr import compare as compare_cli
from infr.cluster import cli as cluster_cli
from infr.serve import server as serve_cli
from infr.errors import InfrError

# flag -> (INFR_* variable, type, default); flags win over the environment
RUN_OPTIONS = {
    "temp": ("INFR_TEMP", float, 0.8),
    "top_k": ("INFR_TOP_K", int, 40),
    "top_p": ("INFR_TOP_P", float, 0.95),
    "min_p": ("INFR_MIN_P", float, 0.05),
    "repeat_penalty": ("INFR_REPEAT_PENALTY", float, 1.0),
    "presence_penalty": ("INFR_PRESENCE_PENALTY", float, 0.0),
    "frequency_penalty": ("INFR_FREQUENCY_PENALTY", float, 0.0),
    "seed": ("INFR_SEED", int, None),
    "max_new": ("INFR_MAX_NEW", int, 512),
    "ctx": ("INFR_CTX", int, 4096),
    "backend": ("INFR_BACKEND", str, "auto"),
    "cpu_moe": ("INFR_CPU_MOE", int, 0),  # experts of the first N MoE layers on the CPU (llama.cpp's --n-cpu-moe)
    "split_mode": ("INFR_SPLIT_MODE", str, None),  # none | layer: one model across GPUs (infr/split.py)
    "tensor_split": ("INFR_TENSOR_SPLIT", str, None),  # each GPU's share of the layers, e.g. 3,1
}
SHORT_FLAGS = {"split_mode": "-sm", "tensor_split": "-ts"}  # llama.cpp's


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infr", description="Run GGUF language models on any GPU, from Python.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="chat with a model (one-shot with MESSAGE, interactive otherwise)",
        description=(
            "MODEL is a .gguf path, an offline model name, or a Hugging Face ref org/repo[:QUANT] "
            f"in the local cache; without it the default {offline.DEFAULT_MODEL} is used. "
            "With one argument that is not a model, it is taken as the MESSAGE."
        ),
    )
    run.add_argument("model", nargs="?", help="model to run")
    run.add_argument("message", nargs="?", help="message to send (omit for an interactive chat)")
    for name, (env, typ, _) in RUN_OPTIONS.items():
        flags = [SHORT_FLAGS[name]] if name in SHORT_FLAGS else []
        run.add_argument(*flags, "--" + name.replace("_", "-"), type=typ, default=None, help=f"(env {env})")
    run.add_argument("--raw", action="store_true", help="send MESSAGE as a plain prompt, print only the text")
    run.add_argument("--system", default=None, help="system message for chat")
    run.add_argument("--device", type=int, default=None, help="GPU adapter number from `infr devices` (env INFR_DEVICE)")
    sub.add_parser("models", help="list the offline models infr can fetch by name")
    sub.add_parser("devices", help="list WebGPU adapters (pick one with INFR_DEVICE=N)")
    cli_store.add_parsers(sub)  # pull, ls, rm
    serve_cli.add_parser(sub)  # serve (infr/serve/server.py)
    cluster_cli.add_parser(sub)  # cluster (infr/cluster/cli.py)
    compare_cli.add_parser(sub)  # compare (infr/compare.py)
    return p


def _options(args: argparse.Namespace) -> dict:
    out = {}
    for name, (env, typ, default) in RUN_OPTIONS.items():
        value = getattr(args, name)
        if value is None and os.environ.get(env) not in (None, ""):
            try:
                value = typ(os.environ[env])
            except ValueError:
                raise InfrError(f"{env}={os.environ[env]!r} is not a valid {typ.__name__}") from None
        out[name] = default if value is None else value
    return out


def _split_model_and_message(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if args.message is not None or args.model is None:
        return args.model, args.message
    # One positional: a model if it names one, else the message for the default model.
    candidate = args.model
    if Path(candidate).expanduser().exists() or offline.lookup(candidate) or candidate.endswith(".gguf"):
        return candidate, None
    if "/" in candidate and " " not in candidate:
        return candidate, None
    return None, candidate


def cmd_run(args: argparse.Namespace) -> int:
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.split import SplitOptions
    from infr.store import resolve

    opts = _options(args)
    if args.device is not None:  # the device layer reads INFR_DEVICE; the flag wins
        os.environ["INFR_DEVICE"] = str(args.device)
    model_ref, message = _split_model_and_message(args)
    if args.raw and message is None:
        raise InfrError("--raw needs a MESSAGE")
    params = SamplingParams(
        temperature=opts["temp"], top_k=opts["top_k"], top_p=opts["top_p"], min_p=opts["min_p"],
        repeat_penalty=opts["repeat_penalty"], presence_penalty=opts["presence_penalty"],
        frequency_penalty=opts["frequency_penalty"], seed=opts["seed"],
    ).validate()
    if opts["max_new"] < 0:
        raise InfrError(f"--max-new must be >= 0, got {opts['max_new']}")
    if opts["cpu_moe"] < 0:
        raise InfrError(f"--cpu-moe must be >= 0, got {opts['cpu_moe']}")
    split = SplitOptions.read(opts["split_mode"], opts["tensor_split"])
    path = resolve(model_ref)
    t0 = time.perf_counter()
    model = Model(path, n_ctx=opts["ctx"], backend=opts["backend"], cpu_moe=opts["cpu_moe"], split=split)
    if model.backend_note:
        print(f"infr: {model.backend_note}", file=sys.stderr)
    print(f"infr: loaded {path.name} on {model.backend_name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if model.template.is_fallback and not args.raw:
        print(f"infr: {model.template.fallback_reason}", file=sys.stderr)
    session = model.session()

    def answer(prompt_ids: list[int]) -> str:
        stream = model.tokenizer.stream(skip_special=True)
        pieces = []
        for token in session.generate(prompt_ids, params, max_new=opts["max_new"]):
            text = stream.push(token)
            pieces.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()
        tail = stream.flush()
        pieces.append(tail)
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        print(f"infr: {session.stats.line()}", file=sys.stderr)
        return "".join(pieces)

    if args.raw:
        answer(model.tokenizer.encode(message, add_special=True))
        return 0
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    if message is not None:
        history.append({"role": "user", "content": message})
        answer(_chat_ids(model, history))
        return 0
    print("infr: interactive chat; /clear forgets the history, /exit or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/clear":
            history = history[:1] if args.system else []
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = answer(_chat_ids(model, history))
        except InfrError as e:  # e.g. the context is full: say so, keep the chat alive
            history.pop()
            print(f"infr: error: {e}", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": reply})


def _chat_ids(model, messages: list[dict]) -> list[int]:
    # render() drops a BOS the template writes when the tokenizer adds its own
    text = model.template.render(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special=True, parse_special=True)


def cmd_models(args: argparse.Namespace) -> int:
    for m in offline.MODELS.values():
        cached = "cached" if offline.cached_path(m).exists() else "not fetched"
        print(f"{m.name:22} {m.size / 1e6:6.0f} MB  {cached:12} {m.description}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from infr.gpu.device import describe_adapters

    from infr.gpu.device import get_device

    for line in describe_adapters():
        print(line)
    dev = get_device()
    print(f"default: {dev.name}; subgroup size {dev.subgroup_size}; "
          f"storage binding {dev.max_binding >> 20} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # argparse binds optional positionals at their first chance, so positionals
    # after flags (`infr run m --temp 0 "hi"`) come back unparsed: place them here.
    args, extra = parser.parse_known_args(argv)
    for value in extra:
        slot = next((s for s in ("model", "message") if getattr(args, s, "") is None), None)
        if value.startswith("-") or slot is None:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, slot, value)
    try:
        return {"run": cmd_run, "models": cmd_models, "devices": cmd_devices, **cli_store.COMMANDS, "serve": serve_cli.cmd_serve, "cluster": cluster_cli.cmd_cluster, "compare": compare_cli.cmd_compare}[args.command](args)
    except InfrError as e:
        if os.environ.get("INFR_DEBUG"):
            raise
        print(f"infr: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130

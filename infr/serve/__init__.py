"""`infr serve`: an OpenAI-compatible HTTP API (Litestar + uvicorn) over one loaded model.

Modules: `app` routes, `schemas` request Structs, `service` requests -> jobs and the worker
threads, `generation` the token loop, `slots` KV-cache slots and metrics, `text` stop strings
and tag splitting, `tools` tool-call dialects, `output` chat deltas, `grammar` llguidance
constrained decoding, `errors` OpenAI error bodies, `server` the CLI entry.
"""

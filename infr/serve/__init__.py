"""`infr serve`: an OpenAI-compatible HTTP API (Litestar + uvicorn) over one loaded model.

Modules: `app` routes, `schemas` request Structs, `service` requests -> jobs on the engine
thread, `generation` one request's stops, grammar and logprobs, `metrics` /metrics, `text` stop strings
and tag splitting, `tools` tool-call dialects, `output` chat deltas, `grammar` llguidance
constrained decoding, `errors` OpenAI error bodies, `server` the CLI entry.
"""

"""Prefix-aware routing over one model's replicas: the ingress tokenizes a request's prompt as the
replicas will, hashes its KV blocks (chained, so a block's hash names the whole prefix up to it, as
the engine's prefix cache does), and sends it to the live replica that last took the longest of
those prefixes, so the replica's prefix cache hits; with no such replica, or one that is busier than
the least loaded by more than the slack, the least loaded live replica takes it."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from infr.errors import InfrError


def block_hashes(tokens: list[int], block_size: int, max_blocks: int) -> list[bytes]:
    """One hash per full block of the prompt (a partial block is never cached), each over the
    previous one and the block's tokens."""
    out: list[bytes] = []
    prev = b""
    n = min(len(tokens) // block_size, max_blocks)
    ids = np.asarray(tokens[: n * block_size], dtype=np.int64)
    for i in range(n):
        prev = hashlib.blake2b(prev + ids[i * block_size:(i + 1) * block_size].tobytes(), digest_size=16).digest()
        out.append(prev)
    return out


class PromptKeys:
    """The prompt tokens of a chat or completion body, from the model file's tokenizer and chat
    template (loaded in the ingress; no weights). Routing only needs the prefix: a body the
    replica will refuse yields no tokens and is routed by load, and the replica gives the error."""

    def __init__(self, ref: str):
        from infr import store
        from infr.chat import ChatTemplate
        from infr.gguf_file import open_gguf
        from infr.tokenizer import Tokenizer

        gguf = open_gguf(store.resolve_or_pull(ref))
        self.tokenizer = tok = Tokenizer.from_gguf(gguf)
        self.template = ChatTemplate.from_gguf(
            gguf, bos_token=tok.piece(tok.bos_id) if tok.bos_id is not None else "",
            eos_token=tok.piece(tok.eos_id) if tok.eos_id is not None else "")

    def tokens(self, path: str, body: dict) -> list[int]:
        try:
            if path.endswith("/chat/completions"):
                messages = [{k: v for k, v in m.items() if v is not None} for m in body["messages"]]
                for m in messages:
                    if m.get("role") == "developer":
                        m["role"] = "system"
                tools = body.get("tools") if body.get("tool_choice") != "none" else None
                text = self.template.render(messages, add_generation_prompt=True, tools=tools or None)
                return self.tokenizer.encode(text, add_special=True, parse_special=True)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
                return list(prompt)
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if isinstance(prompt, str):
                return self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        except (InfrError, KeyError, TypeError, AttributeError, ValueError):
            pass
        return []


@dataclass
class Replicas:
    """The ingress's view of one model's replica slots: requests in flight on each, which are
    live, and the prefix affinity map (block hash -> slot, least recently used first)."""

    n: int
    block_size: int
    max_blocks: int
    entries: int
    slack: int
    load: list[int] = field(init=False)
    live: list[bool] = field(init=False)
    affinity: OrderedDict = field(init=False, default_factory=OrderedDict)
    picks: list[int] = field(init=False)  # when each slot was last chosen: ties go to the longest idle
    routed: dict[str, int] = field(init=False, default_factory=lambda: {"prefix": 0, "load": 0})
    _clock: int = field(init=False, default=0)

    def __post_init__(self):
        self.load, self.live, self.picks = [0] * self.n, [True] * self.n, [0] * self.n

    def live_slots(self) -> list[int]:
        return [i for i in range(self.n) if self.live[i]]

    def least_loaded(self) -> int | None:
        slots = self.live_slots()
        return min(slots, key=lambda i: (self.load[i], self.picks[i])) if slots else None

    def choose(self, hashes: list[bytes]) -> int | None:
        """The slot for a prompt with these block hashes; None when no replica is live."""
        best = self.least_loaded()
        if best is None:
            return None
        pick, why = best, "load"
        for h in reversed(hashes):  # the longest cached prefix first
            slot = self.affinity.get(h)
            if slot is not None and self.live[slot]:
                if self.load[slot] <= self.load[best] + self.slack:
                    pick, why = slot, "prefix"
                break
        self.routed[why] += 1
        self._clock += 1
        self.picks[pick] = self._clock
        for h in hashes:  # the chosen replica now holds (or will) each of these prefixes
            self.affinity[h] = pick
            self.affinity.move_to_end(h)
        while len(self.affinity) > self.entries:
            self.affinity.popitem(last=False)
        return pick

    def failed(self, slot: int) -> None:
        """The slot's replica died: no new requests until a probe finds it back; what its prefix
        cache held is gone, so its affinities go too."""
        self.live[slot] = False
        for h in [h for h, s in self.affinity.items() if s == slot]:
            del self.affinity[h]

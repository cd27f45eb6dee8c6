"""Constrained decoding with llguidance: a token mask per step that only lets through tokens
keeping the output a valid prefix of a JSON document matching the schema."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from infr.sampling import unpack_mask

from infr.serve.errors import APIError


class _Vocab:
    """What llguidance's TokenizerWrapper reads: token bytes, EOS, and an encode callable."""

    def __init__(self, tok):
        self._tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids)
        self.bos_token_id = tok.bos_id
        tokens, special = [], []
        for i in range(tok.n_vocab):
            b = tok.token_to_bytes(i, special=True)
            if tok.is_control(i):
                b = b"\xff" + b  # llguidance's mark for special tokens: never matched as text
                special.append(i)
            tokens.append(b)
        self.tokens = tokens
        self.special_token_ids = special

    def __call__(self, text):
        if isinstance(text, bytes):
            raise TypeError("str only")  # makes TokenizerWrapper hand us str
        return self._tok.encode(text, add_special=False, parse_special=False)


class Grammars:
    """Builds the llguidance tokenizer once per model (about a second for a 150k vocabulary)."""

    def __init__(self, tokenizer, n_vocab: int):
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self._ll = None
        self._lock = threading.Lock()

    def _lltokenizer(self):
        with self._lock:
            if self._ll is None:
                import llguidance

                wrapper = llguidance.TokenizerWrapper(_Vocab(self.tokenizer))
                eos = sorted(self.tokenizer.eog_ids) or None
                self._ll = llguidance.LLTokenizer(wrapper, eos_token=eos)
            return self._ll

    def json_matcher(self, schema: dict[str, Any] | None, where: str = "response_format") -> Constraint:
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema if schema is not None else {"type": "object"}),
                defaults={"whitespace_flexible": False},
            )
        except (ValueError, TypeError) as e:
            raise APIError(400, f"{where}: invalid JSON schema: {e}", param=where) from None
        ll = self._lltokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, ll)
        if error and not error.startswith("WARNING"):
            raise APIError(400, f"{where}: invalid or unsupported JSON schema: {error}", param=where)
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        if matcher.is_error():
            raise APIError(400, f"{where}: invalid JSON schema: {matcher.get_error()}", param=where)
        return Constraint(matcher, self.n_vocab)


class Constraint:
    """One request's matcher: masks logits, follows sampled tokens."""

    def __init__(self, matcher, n_vocab: int):
        self.matcher = matcher
        self.n_vocab = n_vocab

    def bitmask(self) -> np.ndarray:
        """The tokens allowed next, as a uint8 bitmask (bit i: token i): what a step's output row carries."""
        return np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        allowed = unpack_mask(self.bitmask(), logits.shape[0])
        return np.where(allowed, logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"constrained decoding failed: {self.matcher.get_error()}")

    def consume_text_tokens(self, tokens: list[int]) -> None:
        for t in tokens:
            self.consume(t)

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()


def tool_call_schema(tools: list[dict], name: str | None) -> dict:
    """The JSON a forced call must be: {"name": <one tool>, "arguments": <its parameters>}."""
    options = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}

"""Tokenizer built from GGUF metadata, giving llama.cpp's token ids.

The encoder is a real `tokenizers.Tokenizer` (HF, Rust) configured to behave
like llama.cpp's llama-vocab.cpp, whose rules are restated here as facts:

* Control, unknown and user-defined tokens are cut out of the raw text first,
  whole and never split; control/unknown ones only when `parse_special`.
  They become HF "added tokens" (not normalized; `special` = control/unknown).
* `tokenizer.ggml.model == "gpt2"`: byte-level BPE over the GGUF merges, after
  the pre-tokenizer regexes that `tokenizer.ggml.pre` selects (applied in
  sequence, every match and every gap its own piece). An unknown `pre` is an
  error, as in llama.cpp.
* `tokenizer.ggml.model == "llama"` (SentencePiece, e.g. Gemma): spaces become
  U+2581, optionally one is prepended to every text fragment, then adjacent
  symbols whose concatenation is a token merge, highest token score first,
  leftmost on ties; characters left unmerged and not in the vocab fall back to
  `<0xNN>` byte tokens. That is BPE whose merge list holds, for every token,
  each split into two tokens, ranked by the token's score: the construction
  in infr.tokenizer_merges. (Equal scores on overlapping candidates could rank differently from
  llama.cpp's leftmost rule; real SPM vocabularies have distinct scores.)

Decoding does not use HF: it joins each token's bytes and applies llama.cpp's
`clean_spaces` passes, so `decode` equals `llama_detokenize`.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from infr.errors import GGUFError, UnsupportedError
from infr.tokenizer_merges import merges_from_gguf, spm_merges
from infr.tokenizer_pre import PRE_TYPES

if TYPE_CHECKING:
    from infr.gguf_file import GGUFFile

log = logging.getLogger(__name__)

# llama_token_attr bits (llama.h); GGUF token_type values map onto them.
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
_RSTRIP = 1 << 8  # LLAMA_TOKEN_ATTR_RSTRIP
_TYPE_TO_ATTR = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}

SPACE = "\u2581"  # SentencePiece's visible space



# --- token texts llama.cpp recognises (llama_vocab::impl::load)

_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)  # fmt: skip
_EOG_TEXTS = frozenset(_EOT_TEXTS) | {
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<|eom_id|>", "[EOS]",
    "<eos>", "<turn|>", "<|tool_response>", "[e~[",
}  # fmt: skip
# (metadata key suffix, texts that identify the token when the key is absent)
_AUTO_IDS = (
    ("eot", _EOT_TEXTS),
    ("eom", ("<|eom_id|>",)),
    ("fim_pre", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                 "<|code_prefix|>", "<|prefix|>")),
    ("fim_suf", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                 "<|code_suffix|>", "<|suffix|>")),
    ("fim_mid", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                 "<|code_middle|>", "<|middle|>")),
    ("fim_pad", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("fim_rep", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("fim_sep", ("<|file_sep|>",)),
)  # fmt: skip
_DEPRECATED_FIM_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: list[str] = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_CHARS = _gpt2_byte_chars()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_CHARS)}

# llama.cpp's clean_spaces passes, in order (each is a left-to-right scan there).
_CLEAN_PASSES = (
    (re.compile(rb" (?=[?!.,])"), b""),
    (re.compile(rb" ' "), b"'"),
    (re.compile(rb" (?='(?:s|m|re|ve))"), b""),
)


def clean_spaces(text: bytes) -> bytes:
    for pattern, repl in _CLEAN_PASSES:
        text = pattern.sub(repl, text)
    return text


class Tokenizer:
    """Token ids <-> text for one GGUF model, as llama.cpp computes them."""

    def __init__(
        self,
        hf: "HFTokenizer | Future[HFTokenizer]",
        tokens: list[str],
        attrs: np.ndarray,
        *,
        kind: str,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
        clean_spaces: bool,
    ):
        self._hf = hf
        self._tokens = tokens
        self._attrs = attrs
        self.kind = kind  # "bpe" (byte-level), "spm", or "spm-bpe" (gemma4 style)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids = eog_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self.clean_spaces = clean_spaces
        self._pieces: list[bytes | None] = [None] * len(tokens)
        self._lock = threading.Lock()  # guards hf.encode_special_tokens, toggled per call

    # --- construction

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "Tokenizer":
        """Build from a model's metadata. The HF tokenizer is built on a thread of its own
        (`hf` waits for it): 0.05-0.1 s for SmolLM2's 49k BPE vocabulary, 0.3-0.4 s for
        Qwen2.5's 152k, 1.1-1.3 s for Gemma 3's 262k SentencePiece vocabulary (its merges read
        from infr.tokenizer_cache), on the 2-core development machine. Most of that is
        `tokenizers.models.BPE` itself, which holds the GIL throughout; a model's load runs
        meanwhile wherever it does not need the GIL (its weights' memory being allocated,
        numpy's kernels), so a cold `infr run` no longer waits for the two one after the other."""
        return _build(gf)

    @property
    def hf(self) -> HFTokenizer:
        """The HF tokenizer; from_gguf builds it on a thread, so the first use may wait for it
        (and raises what building it raised)."""
        hf = self._hf
        if isinstance(hf, Future):
            hf = self._hf = hf.result()
        return hf

    # --- vocabulary

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def piece(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary ('Ġthe', '▁the', '<0x0A>')."""
        return self._tokens[self._check(token_id)]

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._check(token_id)] & (CONTROL | UNKNOWN))

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly `text`, if any."""
        return self.hf.token_to_id(text)

    # --- encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self._require(self.bos_id, "BOS"))
        if text:
            with self._lock:
                self.hf.encode_special_tokens = not parse_special
                ids.extend(self.hf.encode(text, add_special_tokens=False).ids)
        if add_special and self.add_eos:
            ids.append(self._require(self.eos_id, "EOS"))
        return ids

    # --- decode

    def token_to_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes token `token_id` contributes to decoded text (llama_token_to_piece).

        Control and unknown tokens give their text only when `special`; unused
        tokens give nothing. Byte tokens give one byte, possibly half a character.
        """
        attr = int(self._attrs[self._check(token_id)])
        if not special and attr & (CONTROL | UNKNOWN):
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._render(token_id, attr)
        return piece

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        ids = list(ids)
        remove_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False  # llama.cpp keeps the space after a removed BOS
            ids = ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = [self.token_to_bytes(t, special=not skip_special) for t in ids]
        if parts and remove_space and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        out = b"".join(parts)
        return clean_spaces(out) if self.clean_spaces else out

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids` as llama_detokenize gives it.

        skip_special=False prints control tokens (unparse_special); True drops them and
        the BOS/EOS the model adds (remove_special). Invalid UTF-8 becomes U+FFFD.
        """
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False, keep: frozenset[int] = frozenset()) -> "StreamDecoder":
        return StreamDecoder(self, skip_special, keep)

    # --- internals

    def _render(self, token_id: int, attr: int) -> bytes:
        text = self._tokens[token_id]
        if attr & (CONTROL | UNKNOWN | USER_DEFINED):
            return text.encode()
        if attr & NORMAL:
            if self.kind != "bpe":
                return text.replace(SPACE, " ").encode()
            return _byte_decode(text)
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens render as nothing in llama.cpp

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return token_id

    @staticmethod
    def _require(token_id: int | None, what: str) -> int:
        if token_id is None:
            raise GGUFError(f"the model asks for a {what} token but defines none")
        return token_id


def _byte_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is None:  # not a byte-level character: llama.cpp writes this marker
            out += b"[UNK_BYTE_0x" + ch.encode().hex().encode() + text.encode() + b"]"
        else:
            out.append(b)
    return bytes(out)


class StreamDecoder:
    """Incremental `decode`: `push` returns only text that can no longer change.

    Bytes of an incomplete UTF-8 character are held back, and with clean_spaces
    so is any tail whose cleaning depends on what follows (every cleaning
    pattern starts with a space and spans at most 6 bytes, so text is released
    up to a point with no space in the 5 bytes before it). The concatenation of
    all `push` results and `flush()` equals `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, keep: frozenset[int] = frozenset()):
        self._tok = tokenizer
        self._skip = skip_special
        self._keep = keep  # special tokens that print even when skipping (a tool dialect's tags)
        self._buf = b""
        self._first = True
        self._remove_space = tokenizer.add_space_prefix

    def push(self, token_id: int) -> str:
        tok = self._tok
        if self._first:
            self._first = False
            if self._skip and tok.add_bos and token_id == tok.bos_id:
                self._remove_space = False
                return ""
            piece = tok.token_to_bytes(token_id, special=not self._skip or token_id in self._keep)
            if self._remove_space and piece.startswith(b" "):
                piece = piece[1:]
        else:
            piece = tok.token_to_bytes(token_id, special=not self._skip or token_id in self._keep)
        self._buf += piece
        end = _complete_prefix(self._buf)
        if tok.clean_spaces:
            end = _clean_cut(self._buf, end)
        return self._release(end)

    def flush(self) -> str:
        """Everything still held (an incomplete character becomes U+FFFD)."""
        return self._release(len(self._buf))

    def _release(self, end: int) -> str:
        if end <= 0:
            return ""
        out, self._buf = self._buf[:end], self._buf[end:]
        if self._tok.clean_spaces:
            out = clean_spaces(out)
        return out.decode("utf-8", errors="replace")


def _complete_prefix(buf: bytes) -> int:
    """Length of `buf` without a trailing, still incomplete UTF-8 sequence."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n - back if need > back else n
    return n


def _clean_cut(buf: bytes, end: int) -> int:
    """Largest cut <= end with no space in the 5 bytes before it."""
    cut = end
    while cut > 0:
        window = buf[max(0, cut - 5) : cut]
        sp = window.rfind(b" ")
        if sp < 0:
            return cut
        cut = max(0, cut - 5) + sp
    return 0


# --- building


def _build(gf: GGUFFile) -> Tokenizer:
    name = gf.path.name
    model = gf.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFError(f"{name}: no tokenizer.ggml.model in metadata")
    tokens = gf.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(f"{name}: no tokenizer.ggml.tokens in metadata")
    if "" in tokens:  # a new list: the metadata's stays as the file has it
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    vocab = dict(zip(tokens, range(n)))
    if len(vocab) != n:
        raise GGUFError(f"{name}: tokenizer.ggml.tokens holds duplicate entries")

    types = gf.get("tokenizer.ggml.token_type")
    if types is None:
        attrs = np.full(n, NORMAL, dtype=np.int32)
    else:
        types = np.asarray(types)[:n]
        attrs = np.zeros(n, dtype=np.int32)
        for t, a in _TYPE_TO_ATTR.items():
            attrs[types == t] = a

    pre_name = gf.get("tokenizer.ggml.pre")
    if model == "llama":
        kind, pre = "spm", None
        defaults = dict(bos=1, eos=2, unk=0)
        add_bos, add_eos, add_space_prefix, clean = True, False, True, False
    elif model in ("gpt2", "gemma4"):
        if model == "gemma4":
            pre_name = "gemma4"
        if pre_name is None:
            log.warning("%s: missing tokenizer.ggml.pre, using 'default'; quality may suffer", name)
            pre_name = "default"
        pre = PRE_TYPES.get(pre_name)
        if pre is None:
            raise UnsupportedError(f"{name}: unknown pre-tokenizer type: '{pre_name}'")
        kind = "spm-bpe" if pre_name == "gemma4" else "bpe"
        defaults = {} if model == "gemma4" else dict(bos=11, eos=11)
        add_bos, add_eos, add_space_prefix, clean = pre.add_bos, False, False, pre.clean_spaces
    else:
        raise UnsupportedError(f"{name}: tokenizer model '{model}' is not supported (infr reads gpt2 and llama)")

    add_space_prefix = bool(gf.get("tokenizer.ggml.add_space_prefix", add_space_prefix))
    add_bos = bool(gf.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(gf.get("tokenizer.ggml.add_eos_token", add_eos))
    if pre_name == "gemma4":
        add_bos = True  # llama.cpp forces it for Gemma 4

    def special_id(key: str, default: int | None = None) -> int | None:
        value = gf.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None and 0 <= int(value) < n:
            return int(value)
        return default if default is not None and 0 <= default < n else None

    bos_id = special_id("bos", defaults.get("bos"))
    eos_id = special_id("eos", defaults.get("eos"))
    eog = _end_of_generation(gf, tokens, vocab, attrs, eos_id, special_id)
    _model_quirks(gf, tokens, vocab, attrs)

    if kind != "spm" and gf.get("tokenizer.ggml.merges") is None:  # this error at load, not first use
        raise GGUFError(f"{name}: cannot find tokenizer merges in model file")
    hf = _on_thread(_hf_tokenizer, gf, kind, pre, tokens, vocab, attrs, add_space_prefix)
    return Tokenizer(
        hf,
        tokens,
        attrs,
        kind=kind,
        bos_id=bos_id,
        eos_id=eos_id,
        eog_ids=eog,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        clean_spaces=clean,
    )


def _end_of_generation(gf, tokens, vocab, attrs, eos_id, special_id) -> frozenset[int]:
    """llama.cpp's special_eog_ids: found by token text, since GGUF has no such list."""
    found: dict[str, int | None] = {}
    for key, texts in _AUTO_IDS:
        tid = special_id(key)
        if tid is None and key in _DEPRECATED_FIM_KEYS:
            tid = special_id(_DEPRECATED_FIM_KEYS[key])
        if tid is None:
            tid = next((vocab[t] for t in texts if t in vocab), None)
            if tid is not None:
                attrs[tid] |= CONTROL  # llama.cpp overrides a non-control type here
        found[key] = tid
    for i in np.flatnonzero(attrs & CONTROL).tolist():  # control tokens named "unused" are unused
        if "unused" in tokens[i]:
            attrs[i] |= UNUSED

    eog = {found[k] for k in ("fim_pad", "fim_rep", "fim_sep") if found[k] is not None}
    for text in _EOG_TEXTS:
        tid = vocab.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
        if text in vocab:
            attrs[vocab[text]] = USER_DEFINED
    eog |= {t for t in (eos_id, found["eot"], found["eom"]) if t is not None}

    texts = {tokens[t]: t for t in eog}
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or ({"<|call|>", "<|calls|>"} & texts.keys() and "<|flush|>" in texts)
    ):
        eog.discard(texts["<|end|>"])  # harmony / solar-open: <|end|> ends a message, not generation
        attrs[texts["<|end|>"]] = USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = NORMAL
    return frozenset(eog)


def _model_quirks(gf, tokens, vocab, attrs) -> None:
    """Per-model token attributes llama.cpp sets by name (none are stored in GGUF).

    Phi-3's special tokens swallow the whitespace after them (HF AddedToken rstrip).
    Checked against llama.cpp on a Phi-3-like vocabulary; HF strips Unicode whitespace
    where llama.cpp strips only ASCII, and would not strip where a whitespace token
    of the vocabulary's own (none in Phi-3) matches first.
    """
    model_name = str(gf.get("general.name", "")).lower()
    if "phi-3" in model_name or "phi3" in model_name:
        for i in np.flatnonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN)):
            attrs[i] |= _RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text in vocab:
                attrs[vocab[text]] = (attrs[vocab[text]] | _RSTRIP) if on else (attrs[vocab[text]] & ~_RSTRIP)


def _on_thread(fn: Callable, *args) -> Future:
    """fn(*args) on a daemon thread; its result or exception in the returned Future."""
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 (re-raised where the result is taken)
            fut.set_exception(e)

    threading.Thread(target=run, name="infr-tokenizer", daemon=True).start()
    return fut


def _hf_tokenizer(gf, kind, pre, tokens, vocab, attrs, add_space_prefix) -> HFTokenizer:
    if kind == "spm":
        merges = spm_merges(gf, tokens, vocab)
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
        steps = [normalizers.Prepend(SPACE)] if add_space_prefix else []
        hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
        dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        hf.decoder = decoders.Sequence([*dec, decoders.Strip(" ", 1, 0)] if add_space_prefix else dec)
    else:
        merges = merges_from_gguf(gf)
        byte_level = kind == "bpe"
        hf = HFTokenizer(
            models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges, byte_fallback=not byte_level)
        )
        splits = [pre_tokenizers.Split(Regex(r), "isolated") for r in pre.regexes]
        if byte_level:
            splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
            hf.decoder = decoders.ByteLevel()
        else:
            hf.normalizer = normalizers.Replace(" ", SPACE)
            hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
        hf.pre_tokenizer = pre_tokenizers.Sequence(splits)

    # Tokens cut out of raw text before the model runs. HF matches them leftmost-longest;
    # llama.cpp longest-first. They agree unless two such tokens overlap in the text.
    added = [
        AddedToken(
            tokens[i],
            special=bool(attrs[i] & (CONTROL | UNKNOWN)),
            normalized=False,
            rstrip=bool(attrs[i] & _RSTRIP),
        )
        for i in np.flatnonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN)).tolist()
    ]
    hf.add_tokens(added)
    return hf

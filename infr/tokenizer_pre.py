"""Pre-tokenizer types of byte-level BPE vocabularies, keyed by `tokenizer.ggml.pre`.

The regexes restate llama.cpp's llama-vocab.cpp (originally each model's
tokenizer.json); each type also carries the decode and BOS defaults it sets.
"""

from __future__ import annotations

from dataclasses import dataclass

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SEED_CODER = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tekken / gpt-4o: llama.cpp runs these with "a letter other than a-z" for \p{Lu}... and "a letter
# other than A-Z" for \p{Ll}... (its regex engine has no case classes), so every non-ASCII letter
# counts as both. Same here, to give the same ids.
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp matches regexes without \p{..} on text whose non-ASCII whitespace became "\v", so
# such whitespace never matches a listed range (U+3000 lies in two below): "&&[^\s]" says so.
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&[^\\s]]+"
# Written with escapes: several of these characters (U+1FBE, U+2126, U+212A, ...) are
# canonical singletons that an editor's NFC normalization would silently replace.
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
    "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002&&[^\\s]]+",
    r"\s+\z",  # std::regex's `$` is the end of the piece; Oniguruma's would also match before "\n"
    _CJK,
    r"\p{N}+",
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type and the flags it sets."""

    regexes: tuple[str, ...]
    clean_spaces: bool = True  # llama.cpp's clean_up_tokenization_spaces on decode
    ignore_merges: bool = False  # a piece that is itself a token is taken whole
    add_bos: bool = False  # default when tokenizer.ggml.add_bos_token is absent


def _pre(regexes: str | tuple[str, ...], **kw: bool) -> PreTokenizer:
    return PreTokenizer((regexes,) if isinstance(regexes, str) else regexes, **kw)


_DEFAULT_PRE = _pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_PRE = _pre(_LLAMA3, ignore_merges=True, add_bos=True)
_STARCODER = (r"\p{N}", _GPT2)
PRE_TYPES: dict[str, PreTokenizer] = {
    "default": _DEFAULT_PRE,
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        _LLAMA3_PRE,
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe"], _pre(_LLAMA3)),
    "deepseek-llm": _pre(_DEEPSEEK_LLM, clean_spaces=False),
    "deepseek-coder": _pre(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"), clean_spaces=False),
    "falcon": _pre((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], _pre(_STARCODER)),
    **dict.fromkeys(["smollm", "command-r"], _pre(_STARCODER, clean_spaces=False)),
    **dict.fromkeys(["gpt-2", "phi-2", "mpt", "olmo", "exaone4", "gigachat", "a.x-4.0", "mellum"], _pre(_GPT2)),
    **dict.fromkeys(["trillion", "granite-docling"], _pre(_GPT2, clean_spaces=False)),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"],
        _pre(_QWEN2, clean_spaces=False),
    ),
    **dict.fromkeys(["stablelm2", "megrez"], _pre(_QWEN2)),
    "qwen35": _pre(_QWEN35, clean_spaces=False),
    "seed-coder": _pre(_SEED_CODER, clean_spaces=False),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie"], _pre(_GPT4O, clean_spaces=False)),
    "tekken": _pre(_TEKKEN, clean_spaces=False, ignore_merges=True, add_bos=True),
    "poro-chat": _pre(_BLOOM, clean_spaces=False),
    **dict.fromkeys(["bloom", "gpt3-finnish"], _pre(_BLOOM)),
    "viking": _pre((_BLOOM, r"\p{N}"), clean_spaces=False),
    # SentencePiece-style BPE on raw UTF-8 (spaces as U+2581), split only at newline runs.
    "gemma4": _pre(r"[^\n]+|[\n]+", add_bos=True),
}
SUPPORTED_PRE = frozenset(PRE_TYPES)

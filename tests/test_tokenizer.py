"""Tokenizer: ids and text locked to llama.cpp's (tests/fixtures/tokenizer_<model>.json, made by
make_tokenizer_fixtures.py), streaming decode, end-of-generation ids, and GGUF errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from infr.errors import InfrError
from infr.gguf_file import open_gguf
from infr.tokenizer import StreamDecoder, Tokenizer

FIXTURE_DIR = Path(__file__).parent / "fixtures"
PATH_FIXTURE = {
    "smollm2-135m": "smollm2_path",
    "gemma3-270m": "gemma3_path",
    "qwen2.5-coder-0.5b": "qwen_coder_path",
}
FIXTURES = {m: json.loads((FIXTURE_DIR / f"tokenizer_{m}.json").read_text("utf-8")) for m in PATH_FIXTURE}
_BUILT: dict[str, Tokenizer] = {}


def tokenizer_for(request, model: str) -> Tokenizer:
    if model not in _BUILT:
        path = request.getfixturevalue(PATH_FIXTURE[model])
        assert path.name == FIXTURES[model]["file"]
        _BUILT[model] = Tokenizer.from_gguf(open_gguf(path))
    return _BUILT[model]


def _case_id(model: str, i: int, case: dict) -> str:
    flags = ("" if case["add_special"] else "-nobos") + ("" if case["parse_special"] else "-noparse")
    return f"{model}-{i:02d}{flags}-{ascii(case['text'][:24])}"


CASES = [(m, i) for m, fx in FIXTURES.items() for i in range(len(fx["cases"]))]
CASE_IDS = [_case_id(m, i, FIXTURES[m]["cases"][i]) for m, i in CASES]


def _text(detok: dict) -> str | None:
    return detok.get("text")


def test_fixtures_cover_the_brief():
    for model, fx in FIXTURES.items():
        texts = [c["text"] for c in fx["cases"]]
        assert len(texts) >= 55, model
        assert "" in texts and any(not c["add_special"] for c in fx["cases"]), model
        assert fx["sha256"] and fx["file"].endswith(".gguf")


@pytest.mark.parametrize("model,i", CASES, ids=CASE_IDS)
def test_encode_matches_llama_cpp(request, model, i):
    tok = tokenizer_for(request, model)
    case = FIXTURES[model]["cases"][i]
    ours = tok.encode(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
    assert ours == case["ids"]


@pytest.mark.parametrize("model,i", CASES, ids=CASE_IDS)
def test_decode_matches_llama_cpp(request, model, i):
    tok = tokenizer_for(request, model)
    case = FIXTURES[model]["cases"][i]
    for skip, key in ((False, "detok"), (True, "detok_skip_special")):
        ref = case[key]
        ours = tok.decode_bytes(case["ids"], skip_special=skip)
        assert ours == (ref["text"].encode() if "text" in ref else bytes.fromhex(ref["hex"])), key


ROUND_TRIP = [
    (m, i)
    for m, i in CASES
    if FIXTURES[m]["cases"][i]["text"]
    in (_text(FIXTURES[m]["cases"][i]["detok"]), _text(FIXTURES[m]["cases"][i]["detok_skip_special"]))
]


@pytest.mark.parametrize("model,i", ROUND_TRIP, ids=[_case_id(m, i, FIXTURES[m]["cases"][i]) for m, i in ROUND_TRIP])
def test_round_trip_where_llama_cpp_round_trips(request, model, i):
    tok = tokenizer_for(request, model)
    case = FIXTURES[model]["cases"][i]
    ids = tok.encode(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
    for skip, key in ((False, "detok"), (True, "detok_skip_special")):
        if _text(case[key]) == case["text"]:
            assert tok.decode(ids, skip_special=skip) == case["text"], key


def test_round_trips_are_most_cases():
    # Guards the filter above: llama.cpp round-trips nearly every string.
    assert len(ROUND_TRIP) >= 0.8 * len(CASES)


def _non_ascii_cases(model: str) -> list[dict]:
    return [c for c in FIXTURES[model]["cases"] if any(ord(ch) > 127 for ch in c["text"])]


@pytest.mark.parametrize("model", list(FIXTURES))
@pytest.mark.parametrize("skip_special", [False, True])
def test_stream_decoder_yields_whole_characters(request, model, skip_special):
    tok = tokenizer_for(request, model)
    cases = _non_ascii_cases(model)
    assert len(cases) >= 15
    for case in cases:
        ref = _text(case["detok_skip_special" if skip_special else "detok"])
        stream = StreamDecoder(tok, skip_special=skip_special)
        chunks = [stream.push(t) for t in case["ids"]]
        chunks.append(stream.flush())
        assert "".join(chunks) == ref, case["text"]
        assert not any("\ufffd" in c for c in chunks), (case["text"], chunks)


@pytest.mark.parametrize("model", list(FIXTURES))
def test_stream_fixtures_split_characters_across_tokens(request, model):
    # The streaming test above means something only if some token ends mid-character.
    tok = tokenizer_for(request, model)
    partial = 0
    for case in _non_ascii_cases(model):
        for t in case["ids"]:
            try:
                tok.token_to_bytes(t).decode("utf-8")
            except UnicodeDecodeError:
                partial += 1
    assert partial >= 5


@pytest.mark.parametrize("model", list(FIXTURES))
def test_special_ids_match_llama_cpp(request, model):
    tok = tokenizer_for(request, model)
    fx = FIXTURES[model]
    assert tok.n_vocab == fx["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        fx["bos_id"],
        fx["eos_id"],
        fx["add_bos"],
        fx["add_eos"],
    )
    assert tok.eog_ids == frozenset(fx["eog_ids"])
    assert all(tok.is_eog(t) for t in fx["eog_ids"])


@pytest.mark.parametrize(
    "model,end_of_turn",
    [("smollm2-135m", "<|im_end|>"), ("qwen2.5-coder-0.5b", "<|im_end|>"), ("gemma3-270m", "<end_of_turn>")],
)
def test_end_of_turn_token_is_eog(request, model, end_of_turn):
    tok = tokenizer_for(request, model)
    tid = tok.token_id(end_of_turn)
    assert tid is not None and tok.piece(tid) == end_of_turn
    assert tok.is_eog(tid)
    assert tok.encode(end_of_turn, add_special=False) == [tid]
    assert tok.decode([tid]) == end_of_turn and tok.decode([tid], skip_special=True) == ""


@pytest.mark.parametrize("model", list(FIXTURES))
def test_token_to_bytes_joins_to_decode_without_clean_spaces(request, model):
    tok = tokenizer_for(request, model)
    for case in FIXTURES[model]["cases"]:
        joined = b"".join(tok.token_to_bytes(t) for t in case["ids"])
        if not tok.clean_spaces and not tok.add_space_prefix:
            assert joined == tok.decode_bytes(case["ids"])


def test_bad_token_id_is_an_error(request):
    tok = tokenizer_for(request, "smollm2-135m")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])


# --- small GGUFs written here


def _write_vocab(path: Path, pre: str | None, tokens: list[str], merges: list[str]) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _byte_vocab() -> tuple[list[str], list[str]]:
    from infr.tokenizer import _BYTE_CHARS

    tokens = list(_BYTE_CHARS) + ["Ġt", "he", "Ġthe", "Ġ.", "Ġ'"]
    return tokens, ["Ġ t", "h e", "Ġt he"]


def test_unknown_pre_tokenizer_is_an_error(tmp_path):
    tokens, merges = _byte_vocab()
    gf = open_gguf(_write_vocab(tmp_path / "odd.gguf", "no-such-pre", tokens, merges))
    with pytest.raises(InfrError, match=r"odd\.gguf: unknown pre-tokenizer type: 'no-such-pre'"):
        Tokenizer.from_gguf(gf)


def test_missing_pre_tokenizer_falls_back_to_default(tmp_path, caplog):
    tokens, merges = _byte_vocab()
    gf = open_gguf(_write_vocab(tmp_path / "nopre.gguf", None, tokens, merges))
    with caplog.at_level(logging.WARNING, logger="infr.tokenizer"):
        tok = Tokenizer.from_gguf(gf)
    assert "missing tokenizer.ggml.pre" in caplog.text
    assert tok.clean_spaces  # llama.cpp's 'default' cleans spaces on decode
    assert tok.decode(tok.encode("the")) == "the"


def test_stream_decoder_equals_decode_with_clean_spaces(tmp_path):
    # No real test model cleans spaces; a gpt-2 pre-tokenizer does. Every cleaning pattern
    # (" .", " ' ", " 's", " 're") and partial UTF-8 bytes, fed in random token orders.
    tokens, merges = _byte_vocab()
    tok = Tokenizer.from_gguf(open_gguf(_write_vocab(tmp_path / "g.gguf", "gpt-2", tokens, merges)))
    assert tok.clean_spaces
    alphabet = tok.encode(" ' s m r e v . , ? ! a 😀 é", add_special=False) + tok.encode(" the 're 's")
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = rng.choice(alphabet, size=int(rng.integers(1, 24))).tolist()
        stream = tok.stream()
        chunks = [stream.push(t) for t in ids] + [stream.flush()]
        assert "".join(chunks) == tok.decode(ids), ids


def _write_spm(path: Path, **keys) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"]
    w.add_token_list(tokens)
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
    w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
    for name, value in keys.items():
        getattr(w, f"add_{name}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_add_bos_defaults_follow_llama_cpp(tmp_path):
    # Absent keys: SentencePiece adds BOS (id 1 by default) and a space prefix; byte-level BPE does neither.
    spm = Tokenizer.from_gguf(open_gguf(_write_spm(tmp_path / "spm.gguf")))
    assert (spm.add_bos, spm.add_eos, spm.add_space_prefix, spm.bos_id, spm.eos_id) == (True, False, True, 1, 2)
    assert spm.encode("a")[0] == 1
    tokens, merges = _byte_vocab()
    bpe = Tokenizer.from_gguf(open_gguf(_write_vocab(tmp_path / "bpe.gguf", "gpt-2", tokens, merges)))
    assert (bpe.add_bos, bpe.add_eos) == (False, False)
    off = Tokenizer.from_gguf(open_gguf(_write_spm(tmp_path / "off.gguf", add_bos_token=False)))
    assert not off.add_bos and off.encode("a")[:1] != [1]


def test_hf_tokenizer_is_built_on_a_thread_and_its_failure_raised_at_first_use(tmp_path):
    # from_gguf returns before tokenizers has built the BPE (a model's load runs meanwhile);
    # what that build raises comes out of the first encode, on every use after, not a hang.
    tokens, merges = _byte_vocab()
    gf = open_gguf(_write_vocab(tmp_path / "bad.gguf", "gpt-2", tokens, merges + ["Ġ zz"]))
    tok = Tokenizer.from_gguf(gf)
    assert tok.piece(tok.n_vocab - 1) == "Ġ'"  # the vocabulary side needs no HF tokenizer
    for _ in range(2):
        with pytest.raises(Exception, match="zz"):
            tok.encode("the")
    good = Tokenizer.from_gguf(open_gguf(_write_vocab(tmp_path / "good.gguf", "gpt-2", tokens, merges)))
    assert good.encode(" the", add_special=False) == [tokens.index("Ġthe")]

"""The layer split's arithmetic and options, CPU only (infr/split.py, Plan.part): llama.cpp's
assignment of layers to devices, the flags and their errors."""

from __future__ import annotations

import pytest

from infr.errors import InfrError, UnsupportedError
from infr.split import SplitOptions, Stage, layer_devices, parse_tensor_split, stages


def _counts(per_layer: list[int], n_dev: int) -> list[int]:
    return [per_layer.count(d) for d in range(n_dev)]


@pytest.mark.parametrize("n_layer, props, counts, out", [
    (30, (1, 1), [16, 14], 1),  # smollm2: il / 31 < 0.5 for il <= 15
    (24, (1, 1), [13, 11], 1),  # qwen2.5-coder 0.5B
    (18, (1, 1), [10, 8], 1),  # gemma3-270m
    (24, (3, 1), [19, 5], 1),  # il / 25 < 0.75 for il <= 18
    (32, (1, 1, 1, 1), [9, 8, 8, 7], 3),
    (3, (1, 1), [2, 1], 1),  # 2 / 4 == 0.5 is not below the split point: upper_bound moves on
    (4, (1, 0), [4, 0], 0),  # a zero share holds nothing, the output included
    (4, (0, 1), [0, 4], 1),
])
def test_layer_devices_follow_llama_cpp(n_layer, props, counts, out):
    per_layer, head = layer_devices(n_layer, props)
    assert _counts(per_layer, len(props)) == counts and head == out
    assert per_layer == sorted(per_layer)  # contiguous ranges, in device order


def test_stages_are_contiguous_and_skip_empty_devices():
    assert stages(30, (1, 1)) == [Stage(0, 0, 16, True, False), Stage(1, 16, 30, False, True)]
    assert stages(4, (0, 1)) == [Stage(1, 0, 4, True, True)]
    # two layers over five devices: 0 -> 0, 1 -> 1, output (2/3) -> 3, devices 2 and 4 hold nothing
    assert stages(2, (1, 1, 1, 1, 1)) == [Stage(0, 0, 1, True, False), Stage(1, 1, 2, False, False),
                                          Stage(3, 2, 2, False, True)]
    for n_layer in (1, 7, 30, 61):
        for props in ((1, 1), (3, 1), (1, 2, 3), (5, 0, 1)):
            parts = stages(n_layer, props)
            assert parts[0].first == 0 and parts[-1].last == n_layer and parts[-1].head and parts[0].embed
            assert all(a.last == b.first for a, b in zip(parts, parts[1:]))


def test_options_read_flags_then_environment():
    assert SplitOptions.read(env={}) == SplitOptions("none", None)
    assert SplitOptions.read(tensor_split="3,1", env={}) == SplitOptions("layer", (3.0, 1.0))  # -ts implies layer
    assert SplitOptions.read("layer", env={}).tensor_split is None  # equal shares of every GPU
    assert SplitOptions.read("none", "1,1", env={}) == SplitOptions("none", None)  # ignored, as llama.cpp does
    env = {"INFR_SPLIT_MODE": "layer", "INFR_TENSOR_SPLIT": "1/2", "INFR_SPLIT_SAME_ADAPTER": "1"}
    assert SplitOptions.read(env=env) == SplitOptions("layer", (1.0, 2.0), True)
    assert SplitOptions.read("none", env=env).mode == "none"  # the flag wins
    assert parse_tensor_split("0.75/0.25") == (0.75, 0.25)  # llama-bench's separator


@pytest.mark.parametrize("text, message", [
    ("1,x", "comma-separated"), ("", "comma-separated"), ("1,,1", "comma-separated"), ("1,-1", ">= 0"),
    ("0,0", "above 0"), ("nan,1", "finite"), (",".join(["1"] * 17), "at most 16"),
])
def test_bad_tensor_split_is_a_clear_error(text, message):
    with pytest.raises(InfrError, match=message):
        SplitOptions.read("layer", text, env={})


def test_bad_split_mode_is_a_clear_error():
    with pytest.raises(UnsupportedError, match="row .* not supported"):
        SplitOptions.read("row", env={})
    with pytest.raises(InfrError, match="none, layer, row"):
        SplitOptions.read("sideways", env={})
    with pytest.raises(InfrError, match="comma-separated"):
        SplitOptions.read(env={"INFR_TENSOR_SPLIT": "a"})


def test_cli_refuses_bad_split_flags_before_loading(capsys, monkeypatch):
    from infr import cli

    monkeypatch.setattr("infr.store.resolve", lambda ref: pytest.fail("the model was resolved"))
    assert cli.main(["run", "smollm2", "hi", "--tensor-split", "1,x"]) == 1
    assert "--tensor-split takes one proportion per GPU" in capsys.readouterr().err
    assert cli.main(["run", "smollm2", "hi", "-sm", "row"]) == 1
    assert "not supported" in capsys.readouterr().err


def test_bench_and_serve_take_the_flags(capsys):
    import argparse

    from infr import bench
    from infr.serve.server import config_from_args

    assert bench.main(["-m", "smollm2", "-ts", "1/0/x"]) == 1
    assert "--tensor-split" in capsys.readouterr().err
    assert bench.split_info(SplitOptions("layer", (3.0, 1.0))) == {"split_mode": "layer",
                                                                  "tensor_split": "0.75/0.25"}
    args = argparse.Namespace(model=None, split_mode="layer", tensor_split="3,1")
    assert config_from_args(args).split == SplitOptions("layer", (3.0, 1.0))
    with pytest.raises(InfrError, match="not supported"):
        config_from_args(argparse.Namespace(model=None, split_mode="row", tensor_split=None))


def test_plan_parts_cover_the_plan(smollm2_path):
    from infr.gguf_file import open_gguf
    from infr.models import build_spec
    from infr.plan import bind, build_plan

    gf = open_gguf(smollm2_path)
    plan = bind(build_plan(build_spec(gf)), gf)
    n = plan.spec.n_layers
    assert plan.carried == ("x",)
    a, b, c = plan.part(0, 10, True, False), plan.part(10, 25, False, False), plan.part(25, n, False, True)
    assert a.layers + b.layers + c.layers == plan.layers
    assert (a.embed, a.head, c.embed, c.head) == (plan.embed, (), (), plan.head)
    assert b.inputs == (("x", plan.spec.n_embd),) and not a.inputs
    assert [st.layer for st in b.state] == list(range(10, 25))
    assert b.layer_starts[0] == 0 and len(b.layer_starts) == 15
    bind(b, gf)  # its shapes check from the handed-in width
    assert "blk.10.attn_norm.weight" in b.weights() and "token_embd.weight" not in b.weights()

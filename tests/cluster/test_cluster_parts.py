"""`infr cluster`'s parts without a Ray cluster: flags, prefix-aware routing, the merged metrics,
the replica's deployment options."""

from __future__ import annotations

import pytest

from infr import cli
from infr.cluster.cli import config_from_args
from infr.cluster.config import ClusterConfig, ModelEntry, parse_model, parse_replicas
from infr.cluster.metrics import merge
from infr.cluster.app import local_gpus
from infr.cluster.replica import adapter_for, deployment_options
from infr.cluster.routing import PromptKeys, Replicas, block_hashes
from infr.errors import InfrError


def _args(*argv):
    return cli._parser().parse_args(["cluster", *argv])


def test_flags_make_the_config():
    cfg = config_from_args(_args("smollm2-135m", "b=smollm2-135m", "--replicas", "2", "--num-gpus", "1",
                                 "--parallel", "8", "--address", "auto", "--port", "9000"))
    assert [(m.ref, m.id) for m in cfg.models] == [("smollm2-135m", "smollm2-135m"), ("smollm2-135m", "b")]
    assert (cfg.replicas, cfg.max_replicas, cfg.num_gpus, cfg.parallel, cfg.address, cfg.port) == \
        (2, None, 1.0, 8, "auto", 9000)
    sc = cfg.serve_config(cfg.models[1])
    assert sc.model == "smollm2-135m" and sc.model_alias == "b" and sc.parallel == 8 and not sc.strict_model
    auto = config_from_args(_args("--replicas", "1:4"))
    assert auto.autoscaling and (auto.replicas, auto.max_replicas) == (1, 4)
    assert [m.id for m in auto.models] == ["smollm2-135m"]


@pytest.mark.parametrize("argv, message", [
    (["m", "m"], "two models are served as 'm'"),
    (["=m"], "bad model"),
    (["m", "--replicas", "0"], "--replicas"),
    (["m", "--replicas", "3:2"], "--replicas"),
    (["m", "--replicas", "two"], "--replicas"),
    (["m", "--parallel", "0"], "--parallel"),
    (["m", "--port", "0"], "--port"),
])
def test_bad_flags_are_one_line_errors(argv, message):
    with pytest.raises(InfrError, match=message):
        config_from_args(_args(*argv))


def test_cli_reports_bad_flags_without_a_traceback(capsys):
    assert cli.main(["cluster", "m", "--replicas", "3:2"]) == 1
    assert capsys.readouterr().err.startswith("infr: error: --replicas")


def test_parsers():
    assert parse_model("a/b.gguf") == ModelEntry("a/b.gguf", "a/b.gguf")
    assert parse_model("x=/tmp/m.gguf").id == "x"
    assert parse_replicas("3") == (3, None) and parse_replicas("0:2") == (0, 2)


def test_block_hashes_chain_full_blocks_only():
    a = block_hashes(list(range(100)), 32, 8)
    assert len(a) == 3  # the partial fourth block is never cached
    b = block_hashes(list(range(64)) + [7] * 40, 32, 8)
    assert b[:2] == a[:2] and b[2] != a[2]
    c = block_hashes([5] + list(range(1, 100)), 32, 8)
    assert all(x != y for x, y in zip(a, c))  # a block's hash names the whole prefix up to it
    assert len(block_hashes(list(range(1000)), 32, 4)) == 4


def test_routing_prefers_the_cached_prefix_then_the_least_loaded():
    r = Replicas(n=2, block_size=32, max_blocks=8, entries=100, slack=1)
    conv_a = block_hashes(list(range(96)), 32, 8)
    conv_b = block_hashes(list(range(1000, 1096)), 32, 8)
    assert r.choose(conv_a) == 0 and r.choose(conv_b) == 1  # no affinity yet: the longest idle
    follow_b = block_hashes(list(range(1000, 1096)) + list(range(64)), 32, 8)
    assert r.choose(follow_b) == 1 and r.routed == {"prefix": 1, "load": 2}
    assert r.choose([]) == 0  # no full block: by load (a tie: the longest idle)
    r.load[1] = 3  # the prefix's replica is busier than the least loaded by more than the slack
    assert r.choose(follow_b) == 0
    assert r.choose(follow_b) == 0  # and the prefix now lives there
    r.load[1] = 0
    r.failed(0)  # a dead replica takes nothing and its affinities go
    assert r.live_slots() == [1] and 0 not in r.affinity.values()
    assert r.choose(conv_a) == 1
    r.failed(1)
    assert r.choose(conv_a) is None


def test_affinity_map_is_bounded():
    r = Replicas(n=2, block_size=4, max_blocks=100, entries=10, slack=0)
    r.choose(block_hashes(list(range(400)), 4, 100))
    assert len(r.affinity) == 10


def test_prompt_keys_match_the_engine_prompt(smollm2_path):
    from infr.engine import Model

    keys = PromptKeys(str(smollm2_path))
    model = Model(smollm2_path, n_ctx=256, backend="cpu")
    msgs = [{"role": "user", "content": "Hello there"}]
    text = model.template.render(msgs, add_generation_prompt=True)
    assert keys.tokens("/v1/chat/completions", {"messages": msgs}) == model.tokenizer.encode(text)
    assert keys.tokens("/v1/completions", {"prompt": "Hi"}) == model.tokenizer.encode("Hi")
    assert keys.tokens("/v1/completions", {"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert keys.tokens("/v1/chat/completions", {"messages": "nope"}) == []  # the replica gives the 400


def test_metrics_merge_labels_each_replica():
    text = ("# HELP infr_x Things.\n# TYPE infr_x counter\ninfr_x 3\n"
            "# HELP infr_y Kinds.\n# TYPE infr_y gauge\ninfr_y{state=\"free\"} 2\n")
    out = merge([({"model": "m", "replica": "0"}, text), ({"model": "m", "replica": "1"}, text)],
                [("cluster_z", "gauge", "Z.", [({"model": "m"}, 1.0)])])
    lines = out.splitlines()
    assert lines.count("# TYPE infr_x counter") == 1
    assert 'infr_x{model="m",replica="1"} 3' in lines
    assert 'infr_y{model="m",replica="0",state="free"} 2' in lines
    assert lines[-3:] == ["# HELP infr_cluster_z Z.", "# TYPE infr_cluster_z gauge", 'infr_cluster_z{model="m"} 1']


def test_deployment_options():
    fixed = deployment_options("engine-0-1", num_cpus=2, num_gpus=1, max_ongoing=64, drain_s=9)
    assert fixed["num_replicas"] == 1 and fixed["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 1}
    assert fixed["graceful_shutdown_timeout_s"] == 9 and "autoscaling_config" not in fixed
    auto = deployment_options("engine-0", num_cpus=1, num_gpus=0, max_ongoing=64, drain_s=9, replicas=0,
                              max_replicas=3)
    assert auto["autoscaling_config"]["min_replicas"] == 0 and auto["autoscaling_config"]["max_replicas"] == 3
    assert (auto["autoscaling_config"]["upscale_delay_s"], auto["autoscaling_config"]["look_back_period_s"]) == \
        (30.0, 30.0)  # Ray Serve's defaults unless the config shortens them
    quick = deployment_options("engine-0", num_cpus=1, num_gpus=0, max_ongoing=64, drain_s=9, replicas=1,
                               max_replicas=2, upscale_delay_s=1, downscale_delay_s=5, look_back_s=2)
    scaling = quick["autoscaling_config"]
    assert (scaling["upscale_delay_s"], scaling["downscale_delay_s"], scaling["look_back_period_s"]) == (1, 5, 2)
    assert "num_replicas" not in auto
    assert ClusterConfig(models=[ModelEntry("m", "m")]).serve_config(ModelEntry("m", "m")).strict_model is False


def test_ray_gpu_ids_map_to_adapters():
    assert adapter_for(0, [0, 2]) == (0, None) and adapter_for(1, [0, 2]) == (2, None)
    index, note = adapter_for(1, [0])  # one adapter (lavapipe), two replicas: the second shares it
    assert index == 0 and "Ray GPU id 1 has no adapter of its own (1 found): sharing adapter 0" == note
    assert adapter_for(3, [0, 2])[0] == 2


def test_local_cluster_advertises_the_gpus_replicas_ask_for(monkeypatch, capsys):
    from infr.gpu import device

    monkeypatch.setattr(device, "gpu_adapters", lambda flavor="wgpu": [0])
    cfg = ClusterConfig(models=[ModelEntry("m", "m")], replicas=2, num_gpus=1, backend="gpu")
    assert local_gpus(cfg, 2) == 2  # more than Ray's CUDA count (0 here): both replicas get placed
    cfg.num_gpus = 0.5
    assert local_gpus(cfg, 3) == 2
    cfg.num_gpus = 0
    assert local_gpus(cfg, 2) is None  # no GPU asked for: Ray's own count
    cfg.num_gpus, cfg.local_gpus = 1, 7
    assert local_gpus(cfg, 2) == 7
    monkeypatch.setattr(device, "gpu_adapters", lambda flavor="wgpu": [0, 1, 2, 3])
    cfg.local_gpus = None
    assert local_gpus(cfg, 2) == 4  # every adapter found, for replicas Ray adds later
    monkeypatch.setattr(device, "gpu_adapters", lambda flavor="wgpu": [])
    with pytest.raises(InfrError, match="no WebGPU adapter found"):
        local_gpus(cfg, 2)
    assert local_gpus(ClusterConfig(models=cfg.models, num_gpus=1, backend="cpu"), 2) == 2
    # before Ray starts: a one-line error, exit 1
    assert cli.main(["cluster", "m", "--num-gpus", "1", "--backend", "gpu"]) == 1
    assert capsys.readouterr().err.startswith("infr: error: --num-gpus 1 --backend gpu: no WebGPU adapter found")

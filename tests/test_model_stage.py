"""Each node's pipeline stage of the model (scripts/lib/model_stage.py, scripts/node/model-stage):
the stage's files and nothing else, in the order vLLM itself gives stages to nodes, on real
safetensors files written here byte by byte; and vLLM's own functions, from the local hosts'
virtualenv, as the reference where it is on this machine."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from functools import cache
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from doubles import fake_hf_hub

from components import image
from scripts.lib import model_stage

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "scripts" / "node" / "model-stage"
TESTBED_CACHE = Path(os.environ.get("VLLM_CLUSTER_TESTBED_CACHE", "/var/cache/vllm-cluster-testbed"))
INDEX = model_stage.INDEX_NAME
MANIFEST = model_stage.MANIFEST_NAME


# --- a real model directory, byte by byte ------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, int], seed: int = 0) -> int:
    """A safetensors file (https://github.com/huggingface/safetensors#format) holding
    float32 tensors of the given lengths; its size."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    data = bytes((i * 31 + seed) % 251 for i in range(offset))
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path.stat().st_size


def layer(n: int, *parts: str) -> list[str]:
    names = {
        "q": f"model.layers.{n}.self_attn.q_proj.weight",
        "mlp": f"model.layers.{n}.mlp.down_proj.weight",
        "norm": f"model.layers.{n}.input_layernorm.weight",
    }
    return [names[part] for part in (parts or names)]


# Four layers over four shards, layer 2 split over two of them, as the Hub's shards do.
SHARDS = {
    "model-00001-of-00004.safetensors": ["model.embed_tokens.weight", *layer(0)],
    "model-00002-of-00004.safetensors": [*layer(1), *layer(2, "q", "norm")],
    "model-00003-of-00004.safetensors": [*layer(2, "mlp"), *layer(3)],
    "model-00004-of-00004.safetensors": ["model.norm.weight", "lm_head.weight"],
}
S1, S2, S3, S4 = sorted(SHARDS)
OTHER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def make_model(directory: Path, *, tied: bool = False, values: int = 64, architecture="LlamaForCausalLM") -> Path:
    """A Llama-like model as the cache holds it: config, tokenizer, chat template, the
    shards and their index, plus what vLLM never reads (original/, .cache/, other formats)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [architecture], "num_hidden_layers": 4, "tie_word_embeddings": tied}
    (directory / "config.json").write_text(json.dumps(config))
    for name in OTHER_FILES[1:]:
        (directory / name).write_text(f"{name} of the model\n")
    weight_map = {}
    for position, (file, names) in enumerate(SHARDS.items()):
        names = [name for name in names if not (tied and name == "lm_head.weight")]
        write_safetensors(directory / file, {name: values * (k + 1) for k, name in enumerate(names)}, seed=position)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": 1234}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index))
    (directory / "original").mkdir(exist_ok=True)
    (directory / "original" / "consolidated.00.pth").write_bytes(b"x" * 100)
    (directory / "original" / "params.json").write_text("{}")
    (directory / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
    (directory / ".cache" / "huggingface" / "download.lock").write_text("")
    (directory / "tf_model.h5").write_bytes(b"h" * 100)
    (directory / "pytorch_model.bin").write_bytes(b"b" * 100)
    model_stage.write_manifest(directory, hub_manifest_of(directory))
    return directory


def hub_tree_of(directory: Path) -> list[dict]:
    """The Hub's tree listing of the files in `directory` as they are (the fake Hub's own
    entries, tests/doubles/fake_hf_hub.py tree_entry), without hf's .cache/ and the manifest."""
    entries = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if path.is_file() and not path.is_symlink() and not relative.startswith(".cache/") and relative != MANIFEST:
            entries.append(fake_hf_hub.tree_entry(fake_hf_hub.describe(path, relative)))
    return entries


def hub_manifest_of(directory: Path, model: str = "org/tiny", revision: str = "main") -> dict:
    return model_stage.manifest_from_tree(hub_tree_of(directory), model=model, revision=revision)


def same_size_change(path: Path, at: int = -1) -> None:
    """One byte of `path` changed, its size and (for a shard, past its header) its form kept."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def weight_map_of(directory: Path) -> dict[str, str]:
    return json.loads((directory / INDEX).read_text())["weight_map"]


def vllm_weight_files(folder: Path) -> list[str]:
    """The safetensors files vLLM loads from `folder`: its glob (model_loader/default_loader.py
    229-235, vLLM 0.32.0 and 0.33.0), then filter_duplicate_safetensors_files
    (model_loader/weight_utils.py 585-611 in 0.32.0, 590-616 in 0.33.0), which raises when
    the index names a file the folder lacks."""
    hf_weights_files = glob.glob(os.path.join(folder, "*.safetensors"))
    index_file_name = os.path.join(folder, INDEX)
    if not os.path.isfile(index_file_name):
        return sorted(hf_weights_files)
    with open(index_file_name) as f:
        weight_map = json.load(f)["weight_map"]
    weight_files_in_index = {os.path.join(folder, weight_map[name]) for name in weight_map}
    missing_files = weight_files_in_index - set(hf_weights_files)
    if missing_files:
        raise FileNotFoundError(f"Weight files referenced in index but missing: {missing_files}")
    return sorted(f for f in hf_weights_files if f in weight_files_in_index)


def tensors_in(files: list[str]) -> set[str]:
    return {name for file in files for name in model_stage.read_header(file)[1] if name != "__metadata__"}


def needed_tensors(weight_map: dict[str, str], stages: list[int], pp: int, tied: bool) -> set[str]:
    return {name for name in weight_map if set(stages) & model_stage.tensor_stages(name, 4, pp, tied)}


def copy(source: Path, target: Path, stages, pp: int, revision: str = "main", **kw) -> dict:
    return model_stage.copy_stage(
        source, target, stages=stages, pp_size=pp, model="org/tiny", revision=revision, streams=4, **kw
    )


# --- vLLM's own functions, from the local hosts' virtualenv -------------------------------


@cache
def vllm_python() -> Path | None:
    """The Python of a complete testbed virtualenv (localhosts/fleet.py fleet_venv) that imports
    vLLM, or None on a machine without one."""
    for python in sorted(TESTBED_CACHE.glob("venv-*/bin/python")):
        if (python.parent.parent / ".complete").exists():
            check = subprocess.run(
                [str(python), "-c", "import vllm.distributed.utils, vllm.v1.executor.ray_utils"],
                capture_output=True,
                timeout=300,
            )
            if check.returncode == 0:
                return python
    return None


def need_vllm() -> Path:
    python = vllm_python()
    if python is None:
        pytest.skip(f"no testbed virtualenv with vLLM under {TESTBED_CACHE} (localhosts/fleet.py fleet_venv builds it)")
    return python


def vllm_source(python: Path, relative: str) -> Path:
    found = sorted(python.parent.parent.glob(f"lib/python3*/site-packages/vllm/{relative}"))
    if not found:
        pytest.skip(f"vLLM's {relative} is not in {python.parent.parent}")
    return found[0]


PP_CASES = [(layers, pp) for layers in (1, 2, 3, 4, 5, 7, 8, 13, 28, 32, 61, 80, 126) for pp in range(1, 9)]
PARTITION_CASES = [
    ("4,4", 8, 2),
    ("1,2,1", 4, 3),
    ("3,1", 4, 2),
    ("0,4", 4, 2),
    ("2,2", 4, 3),
    ("2,3", 4, 2),
    ("a,b", 4, 2),
]
# Bundles as Ray's PACK placement may lay them (interleaved too) over nodes with random IDs.
V2_CASES = [
    {
        "ips": {"c3f0": "10.0.0.9", "ab12": "10.0.0.10", "0f77": "10.0.0.2"},
        "driver": "c3f0",
        "bundles": ["ab12", "c3f0", "0f77"],
        "tp": 1,
        "pp": 3,
        "gpus": 1,
    },
    {
        "ips": {"9e01": "10.0.1.5", "1d44": "10.0.1.6"},
        "driver": "9e01",
        "bundles": ["1d44", "9e01"] * 8,
        "tp": 8,
        "pp": 2,
        "gpus": 8,
    },
    {
        "ips": {"77": "10.1.0.1", "a0": "10.1.0.2", "05": "10.1.0.3", "5f": "10.1.0.4"},
        "driver": "a0",
        "bundles": ["05", "77", "5f", "a0", "a0", "77", "05", "5f"],
        "tp": 2,
        "pp": 4,
        "gpus": 2,
    },
]

VLLM_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from unittest import mock
    from vllm.distributed.utils import get_pp_indices
    import vllm.v1.executor.ray_utils as ray_utils

    query = json.loads(sys.stdin.read())
    pp = {}
    for layers, size in query["pp"]:
        os.environ.pop("VLLM_PP_LAYER_PARTITION", None)
        pp[f"{layers}/{size}"] = [list(get_pp_indices(layers, rank, size)) for rank in range(size)]
    partitions = {}
    for partition, layers, size in query["partitions"]:
        os.environ["VLLM_PP_LAYER_PARTITION"] = partition
        try:
            partitions[partition + f"/{layers}/{size}"] = [list(get_pp_indices(layers, r, size)) for r in range(size)]
        except ValueError:
            partitions[partition + f"/{layers}/{size}"] = "ValueError"
    key = ray_utils.current_platform.ray_device_key or "GPU"
    orders = []
    for case in query["v2"]:
        group = mock.Mock(bundle_specs=[{key: 1.0} for _ in case["bundles"]])
        table = {"bundles_to_node_id": dict(enumerate(case["bundles"]))}
        nodes = [{"NodeID": n, "NodeManagerAddress": ip, "Alive": True} for n, ip in case["ips"].items()]
        with mock.patch.object(ray_utils, "placement_group_table", return_value=table), \\
             mock.patch.object(ray_utils.ray, "nodes", return_value=nodes), \\
             mock.patch.object(ray_utils.ray, "get_runtime_context") as context, \\
             mock.patch.object(ray_utils.current_platform, "ray_device_key", key):
            context.return_value.get_node_id.return_value = case["driver"]
            orders.append([ip for _, _, ip in ray_utils.get_bundles_sorted_by_node(group)])
    print(json.dumps({"pp": pp, "partitions": partitions, "v2": orders}))
    """
)


@pytest.fixture(scope="module")
def vllm_answers() -> dict:
    """get_pp_indices and RayExecutorV2's get_bundles_sorted_by_node, run by vLLM itself
    (one subprocess: importing vLLM takes seconds)."""
    python = need_vllm()
    query = {"pp": PP_CASES, "partitions": PARTITION_CASES, "v2": V2_CASES}
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    run = subprocess.run(
        [str(python), "-c", VLLM_SCRIPT], input=json.dumps(query), capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


# --- layers, stages, nodes ----------------------------------------------------------------


def test_pp_layer_range_is_vllms_get_pp_indices(vllm_answers):
    for layers, pp in PP_CASES:
        ours = [list(model_stage.pp_layer_range(layers, rank, pp)) for rank in range(pp)]
        assert ours == vllm_answers["pp"][f"{layers}/{pp}"], (layers, pp)


def test_pp_layer_range_honours_vllms_partition_and_its_errors(vllm_answers):
    for partition, layers, pp in PARTITION_CASES:
        try:
            ours = [list(model_stage.pp_layer_range(layers, rank, pp, partition)) for rank in range(pp)]
        except ValueError:
            ours = "ValueError"
        assert ours == vllm_answers["partitions"][f"{partition}/{layers}/{pp}"], partition


def test_pp_layer_range_as_read_from_the_source():
    """The layouts the module docstring derives, independent of vLLM's presence: the layers
    left over go to the stages before the last."""
    assert [model_stage.pp_layer_range(4, r, 3) for r in range(3)] == [(0, 1), (1, 3), (3, 4)]
    assert [model_stage.pp_layer_range(80, r, 2) for r in range(2)] == [(0, 40), (40, 80)]
    assert [model_stage.pp_layer_range(61, r, 4) for r in range(4)] == [(0, 15), (15, 30), (30, 46), (46, 61)]
    assert [model_stage.pp_layer_range(4, r, 2, "3,1") for r in range(2)] == [(0, 3), (3, 4)]
    with pytest.raises(ValueError):
        model_stage.pp_layer_range(4, 0, 2, "2,3")


def stages_from_order(order: list[str], tp: int) -> dict[str, list[int]]:
    """Worker i (vLLM's adjusted rank) serves pipeline rank i // TP (parallel_state.py 2135-2141)."""
    stages: dict[str, set[int]] = {}
    for rank, ip in enumerate(order):
        stages.setdefault(ip, set()).add(rank // tp)
    return {ip: sorted(found) for ip, found in stages.items()}


def test_node_stages_follow_vllms_ray_executor_v2(vllm_answers):
    """RayExecutorV2 (vLLM 0.32's default, 0.33's only): the head, then nodes by Ray node ID."""
    for case, order in zip(V2_CASES, vllm_answers["v2"], strict=True):
        ips = list(case["ips"].values())
        head = case["ips"][case["driver"]]
        node_ids = {ip: node for node, ip in case["ips"].items()}
        ours = model_stage.node_stages(ips, head, case["gpus"], case["tp"], case["pp"], ray_node_ids=node_ids)
        assert ours == stages_from_order(order, case["tp"]), case


def test_node_stages_by_ray_node_id_not_by_ip():
    ips = ["10.0.0.9", "10.0.0.10", "10.0.0.2"]
    ids = {"10.0.0.9": "ff", "10.0.0.10": "b0", "10.0.0.2": "3c"}
    assert model_stage.node_stages(ips, "10.0.0.9", 1, 1, 3, ray_node_ids=ids) == {
        "10.0.0.9": [0],
        "10.0.0.2": [1],
        "10.0.0.10": [2],
    }


def test_without_ray_node_ids_the_nodes_after_the_head_get_every_stage_they_may_serve():
    """V2's order of the nodes after the head is the raylets' random IDs: unknown before Ray
    runs; each such node then holds every stage any of them may get (never a missing one)."""
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert model_stage.node_stages(ips, "10.0.0.1", 1, 1, 3) == {
        "10.0.0.1": [0],
        "10.0.0.2": [1, 2],
        "10.0.0.3": [1, 2],
    }
    # One node after the head: nothing unknown.
    assert model_stage.node_stages(ips[:2], "10.0.0.2", 8, 8, 2) == {"10.0.0.1": [1], "10.0.0.2": [0]}


def test_node_stages_follow_vllms_legacy_executor_string_ip_order():
    """RayDistributedExecutor (0.32 with VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0): its own sort key,
    taken from vLLM's source, sorts 10.0.0.10 before 10.0.0.9."""
    ips = ["10.0.0.9", "10.0.0.10", "10.0.0.2", "10.0.0.100"]
    ours = model_stage.node_stages(ips, "10.0.0.2", 2, 2, 4, executor="v1")
    assert ours == {"10.0.0.2": [0], "10.0.0.10": [1], "10.0.0.100": [2], "10.0.0.9": [3]}
    python = vllm_python()
    if python is None:
        return  # the order above was read from ray_executor.py 250-269; vLLM's own key is not on this machine
    tree = ast.parse(vllm_source(python, "v1/executor/ray_executor.py").read_text())
    function = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "sort_by_driver_then_worker_ip"
    )
    function.args.args[0].annotation = None
    namespace = {"driver_ip": "10.0.0.2", "ip_counts": dict.fromkeys(ips, 2)}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "ray_executor.py", "exec"), namespace)
    workers = [SimpleNamespace(ip=ip) for ip in reversed(ips) for _ in range(2)]
    order = [worker.ip for worker in sorted(workers, key=namespace["sort_by_driver_then_worker_ip"])]
    assert ours == stages_from_order(order, 2)


@pytest.mark.parametrize("executor", ["v1", "v2"])
def test_node_stages_of_common_layouts(executor):
    two = ["10.0.0.5", "10.0.0.6"]
    assert model_stage.node_stages(two, "10.0.0.6", 8, 8, 2, executor=executor) == {"10.0.0.5": [1], "10.0.0.6": [0]}
    # TP 4 x PP 2 on one node of 8 GPUs: the node holds both stages.
    assert model_stage.node_stages(["10.0.0.5"], "10.0.0.5", 8, 4, 2, executor=executor) == {"10.0.0.5": [0, 1]}
    # TP 4 x PP 4 on two nodes of 8: two stages each.
    assert model_stage.node_stages(two, "10.0.0.5", 8, 4, 4, executor=executor) == {
        "10.0.0.5": [0, 1],
        "10.0.0.6": [2, 3],
    }


def test_node_stages_refuse_what_vllm_cannot_place():
    with pytest.raises(ValueError, match="one worker per GPU"):
        model_stage.node_stages(["10.0.0.1", "10.0.0.2"], "10.0.0.1", 8, 8, 1)
    with pytest.raises(ValueError, match="not one of the gang"):
        model_stage.node_stages(["10.0.0.1"], "10.0.0.2", 1, 1, 1)
    with pytest.raises(ValueError, match="repeats"):
        model_stage.node_stages(["10.0.0.1", "10.0.0.1"], "10.0.0.1", 1, 1, 2)
    with pytest.raises(ValueError, match="no Ray node ID"):
        model_stage.node_stages(["10.0.0.1", "10.0.0.2"], "10.0.0.1", 1, 1, 2, ray_node_ids={"10.0.0.1": "a"})


def test_tensor_stages_place_llama_tensors_and_every_other_name_everywhere():
    def stages(name, tied=False, layout="llama"):
        return model_stage.tensor_stages(name, 4, 3, tied, layout=layout)

    assert stages("model.layers.0.mlp.down_proj.weight") == {0}
    assert stages("model.layers.2.self_attn.q_proj.weight") == {1}
    assert stages("model.embed_tokens.weight") == {0}
    assert stages("model.embed_tokens.weight", tied=True) == {0, 2}
    assert stages("model.norm.weight") == stages("lm_head.weight") == {2}
    assert stages("model.layers.4.mlp.weight") == {0, 1, 2}  # past num_hidden_layers (MTP): not placed
    assert stages("model.rotary_emb.inv_freq") == {0, 1, 2}
    assert stages("model.norm.weight", layout="layers") == {0, 1, 2}  # Mixtral: norm on every stage
    assert stages("model.layers.0.mlp.down_proj.weight", layout="whole") == {0, 1, 2}


def test_model_layout_and_placement_read_the_config():
    assert model_stage.model_layout({"num_hidden_layers": 80, "tie_word_embeddings": False}) == (80, False)
    # Multimodal: the language model's layers in text_config; no tie_word_embeddings counts as tied.
    assert model_stage.model_layout({"text_config": {"num_hidden_layers": 40}}) == (40, True)
    with pytest.raises(ValueError):
        model_stage.model_layout({"hidden_size": 8})
    assert model_stage.placement({"architectures": ["Qwen2ForCausalLM"]})[0] == "llama"
    assert model_stage.placement({"architectures": ["MixtralForCausalLM"]})[0] == "layers"
    assert model_stage.placement({"architectures": ["Gemma3ForCausalLM"]})[0] == "whole"


# --- the files of each stage --------------------------------------------------------------


@pytest.mark.parametrize(
    "pp, tied, expected",
    [
        (2, False, [[S1, S2], [S2, S3, S4]]),
        (2, True, [[S1, S2], [S1, S2, S3, S4]]),
        (3, False, [[S1], [S2, S3], [S3, S4]]),
        (3, True, [[S1], [S2, S3], [S1, S3, S4]]),
    ],
)
def test_each_stage_gets_exactly_the_files_of_its_tensors(tmp_path, pp, tied, expected):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main", tied=tied)
    weight_map = weight_map_of(source)
    found = [model_stage.stage_files(weight_map, [stage], 4, pp, tied) for stage in range(pp)]
    assert found == expected
    for stage in range(pp):
        target = tmp_path / "local" / f"stage-{stage}"
        summary = copy(source, target, [stage], pp)
        assert summary["mode"] == "local" and summary["files"] == expected[stage]
        index = json.loads((target / INDEX).read_text())
        assert sorted(set(index["weight_map"].values())) == expected[stage]
        assert index["metadata"] == {"total_size": 1234}
        assert sorted(p.name for p in target.glob("*.safetensors")) == expected[stage]
        # vLLM's own file selection passes on the stage's directory, and its files hold
        # every tensor the stage needs.
        loaded = vllm_weight_files(target)
        assert [Path(f).name for f in loaded] == expected[stage]
        assert needed_tensors(weight_map, [stage], pp, tied) <= tensors_in(loaded)


def test_the_full_index_in_a_stage_directory_is_what_vllm_refuses(tmp_path):
    """Why the stage gets its own index: with the cache's, vLLM raises FileNotFoundError."""
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    copy(source, target, [0], 2)
    (target / INDEX).write_text((source / INDEX).read_text())
    with pytest.raises(FileNotFoundError, match="missing"):
        vllm_weight_files(target)


def test_the_copy_holds_vllms_other_files_and_nothing_vllm_never_reads(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    copy(source, target, [1], 2)
    held = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert held == sorted([*OTHER_FILES, INDEX, model_stage.MARKER_NAME, S2, S3, S4])
    for name in OTHER_FILES:
        assert (target / name).read_bytes() == (source / name).read_bytes()
    for name in (S2, S3, S4):
        assert not (target / name).is_symlink() and (target / name).read_bytes() == (source / name).read_bytes()


def test_stage_index_keeps_a_valid_index():
    index = {"metadata": {"total_size": 9}, "weight_map": {"a": "f1", "b": "f2", "c": "f1"}}
    assert model_stage.stage_index(index, ["f1"]) == {
        "metadata": {"total_size": 9},
        "weight_map": {"a": "f1", "c": "f1"},
    }
    assert index["weight_map"] == {"a": "f1", "b": "f2", "c": "f1"}


def test_a_model_without_an_index_is_copied_whole_to_every_stage(tmp_path):
    source = tmp_path / "cache" / "org" / "one" / "main"
    source.mkdir(parents=True)
    (source / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4}))
    write_safetensors(source / "model.safetensors", {"model.embed_tokens.weight": 64, "model.layers.0.x": 8})
    model_stage.write_manifest(source, hub_manifest_of(source, model="org/one"))
    for stage in range(2):
        summary = copy(source, tmp_path / f"local-{stage}", [stage], 2)
        assert summary["files"] == ["model.safetensors"] and summary["layout"] == "whole"
        assert summary["stage_bytes"] == summary["total_weight_bytes"]
        assert not (tmp_path / f"local-{stage}" / INDEX).exists()
        assert vllm_weight_files(tmp_path / f"local-{stage}") == [
            str(tmp_path / f"local-{stage}" / "model.safetensors")
        ]


def test_an_unknown_architecture_gets_every_file_on_every_stage(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main", architecture="Gemma3ForCausalLM")
    summary = copy(source, tmp_path / "local", [0], 2)
    assert summary["layout"] == "whole" and summary["files"] == [S1, S2, S3, S4]


# --- copying ------------------------------------------------------------------------------


def test_a_second_copy_copies_nothing(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    first = copy(source, target, [0], 2)
    stage_bytes = sum((source / name).stat().st_size for name in (S1, S2))
    others = sum((source / name).stat().st_size for name in OTHER_FILES)
    assert (first["mode"], first["unchanged"], first["bytes_copied"]) == ("local", False, stage_bytes + others)
    second = copy(source, target, [0], 2)
    assert second["unchanged"] is True and second["bytes_copied"] == 0
    assert second["bytes_kept"] == stage_bytes + others and "nothing copied" in second["reason"]
    marker = json.loads((target / model_stage.MARKER_NAME).read_text())
    assert marker["state"] == "complete" and marker["revision"] == "main" and marker["stages"] == [0]


def test_a_truncated_file_is_found_and_copied_again(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    copy(source, target, [0], 2)
    os.truncate(target / S2, (target / S2).stat().st_size - 10)
    assert "truncated" in model_stage.check_weight_file(target / S2, set())
    again = copy(source, target, [0], 2)
    assert again["bytes_copied"] == (source / S2).stat().st_size and not again["unchanged"]
    assert (target / S2).read_bytes() == (source / S2).read_bytes()


def test_a_new_revision_is_copied_again_and_the_old_files_go(tmp_path):
    old = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    new = make_model(tmp_path / "cache" / "org" / "tiny" / "rev2")
    target = tmp_path / "local"
    copy(old, target, [0], 2)
    (target / "stray.safetensors").write_bytes(b"")
    again = copy(new, target, [0], 2, revision="rev2")
    # Same sizes, maybe other bytes: nothing of another revision is kept.
    assert again["bytes_kept"] == 0 and again["bytes_copied"] > 0
    assert not (target / "stray.safetensors").exists()
    assert json.loads((target / model_stage.MARKER_NAME).read_text())["source"] == str(new.resolve())


def test_another_stage_keeps_the_shared_file_and_drops_the_rest(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    copy(source, target, [0], 2)
    moved = copy(source, target, [1], 2)
    assert moved["bytes_kept"] >= (source / S2).stat().st_size
    assert moved["bytes_copied"] == sum((source / name).stat().st_size for name in (S3, S4))
    assert sorted(p.name for p in target.glob("*.safetensors")) == [S2, S3, S4]


def test_large_files_are_copied_in_parallel_ranges_byte_for_byte(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main", values=3000)
    target = tmp_path / "local"
    said = []
    summary = copy(source, target, [0, 1], 2, range_bytes=4096, progress=said.append, progress_seconds=0)
    for name in (S1, S2, S3, S4):
        assert (target / name).read_bytes() == (source / name).read_bytes()
    assert summary["bytes_copied"] > 4096 * 10
    assert any(text.startswith("copied ") and "MB/s" in text for text in said), said
    assert not list(target.rglob("*.partial"))


def test_a_broken_file_on_the_cache_is_refused_by_name(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    os.truncate(source / S2, (source / S2).stat().st_size - 1)
    with pytest.raises(model_stage.StageError, match=f"{S2}.*truncated.*model command"):
        copy(source, tmp_path / "local", [0], 2)
    assert not (tmp_path / "local" / S2).exists() and not list((tmp_path / "local").glob("*.partial"))


def test_no_room_serves_the_stage_from_the_cache_through_links(tmp_path, monkeypatch):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    monkeypatch.setattr(model_stage.shutil, "disk_usage", lambda _path: SimpleNamespace(free=100))
    summary = copy(source, target, [1], 2)
    assert summary["mode"] == "cache" and "GB free" in summary["reason"] and summary["bytes_copied"] == 0
    for name in (S2, S3, S4, *OTHER_FILES):
        assert (target / name).is_symlink() and (target / name).resolve() == (source / name).resolve()
    assert not (target / S1).exists() and not (target / INDEX).is_symlink()
    assert [Path(f).name for f in vllm_weight_files(target)] == [S2, S3, S4]
    assert copy(source, target, [1], 2)["unchanged"] is True
    # Room again: the next run copies.
    monkeypatch.undo()
    local = copy(source, target, [1], 2)
    assert local["mode"] == "local" and not (target / S3).is_symlink()


def test_no_local_disk_serves_from_the_cache(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    summary = copy(source, tmp_path / "local", [0], 2, local_root=tmp_path / "nvme")
    assert summary["mode"] == "cache" and "does not exist" in summary["reason"]
    assert (tmp_path / "local" / S1).is_symlink()


def test_a_directory_that_is_not_a_copy_is_left_alone(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "someone-elses"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(model_stage.StageError, match="not a copy"):
        copy(source, target, [0], 2)
    assert (target / "notes.txt").read_text() == "mine"


# --- safetensors checks, the download's split, the bytes read ------------------------------


def test_check_weight_file_names_each_problem(tmp_path):
    path = tmp_path / "a.safetensors"
    size = write_safetensors(path, {"x": 10, "y": 20})
    assert model_stage.expected_file_size(path) == size
    assert model_stage.check_weight_file(path, {"x", "y"}) is None
    assert "z are not in it" in model_stage.check_weight_file(path, {"x", "z"})
    with open(path, "ab") as file:
        file.write(b"\0")
    assert "longer" in model_stage.check_weight_file(path, set())
    os.truncate(path, 20)
    assert "header is cut short" in model_stage.check_weight_file(path, set())
    path.write_bytes(b"\x02\0\0\0\0\0\0\0{]")
    assert "not JSON" in model_stage.check_weight_file(path, set())
    assert model_stage.check_weight_file(tmp_path / "gone.safetensors", set()) == "gone.safetensors: missing"


def test_split_for_download_is_disjoint_complete_and_balanced():
    sizes = {f"model-{i:05d}.safetensors": (i * 7919) % 5000 + 1000 for i in range(30)} | {"config.json": 10}
    for parts in (1, 2, 3, 4, 7):
        split = model_stage.split_for_download(sizes, parts)
        assert len(split) == parts
        names = [name for part in split for name in part]
        assert sorted(names) == sorted(sizes) and len(names) == len(set(names))
        loads = [sum(sizes[name] for name in part) for part in split]
        assert max(loads) - min(loads) <= max(sizes.values())
        assert split == model_stage.split_for_download(dict(reversed(list(sizes.items()))), parts)
    assert model_stage.split_for_download({"a": 5, "b": 5}, 3) == [["a"], ["b"], []]
    with pytest.raises(ValueError):
        model_stage.split_for_download(sizes, 0)


def test_bytes_read_per_node_for_a_70b_model_on_two_nodes():
    total, stage = 141_000_000_000, 70_600_000_000
    cache = model_stage.bytes_read_per_node(total, stage, 8, "eager", False)
    assert (cache["from_cache_bytes"], cache["page_cache_bytes"], cache["local_disk_bytes"]) == (total, 8 * total, 0)
    local = model_stage.bytes_read_per_node(total, stage, 8, "eager", True)
    assert (local["from_cache_bytes"], local["page_cache_bytes"], local["local_disk_bytes"]) == (
        stage,
        8 * stage,
        stage,
    )
    links = model_stage.bytes_read_per_node(total, stage, 8, None, False, stage_links=True)
    assert links["from_cache_bytes"] == stage and links["local_disk_bytes"] == 0
    # vLLM's auto-prefetch: the default strategy, a network file system, 90% of RAM.
    assert model_stage.bytes_read_per_node(total, stage, 8, None, False, available_ram_bytes=2 * total)["prefetch"]
    assert not model_stage.bytes_read_per_node(total, stage, 8, None, False, available_ram_bytes=total)["prefetch"]
    assert model_stage.bytes_read_per_node(total, stage, 8, None, False)["prefetch"] is None
    assert model_stage.bytes_read_per_node(total, stage, 8, None, True)["prefetch"] is False
    assert model_stage.bytes_read_per_node(total, stage, 8, "prefetch", True)["prefetch"] is True
    with pytest.raises(ValueError):
        model_stage.bytes_read_per_node(total, stage, 8, "fast", False)


# --- the command ----------------------------------------------------------------------------


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLI), *args], capture_output=True, text=True, timeout=120, env=env or dict(os.environ)
    )


def test_cli_local_copies_this_nodes_stage_and_prints_one_json_line(tmp_path):
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    env = {k: v for k, v in os.environ.items() if k not in ("NVME_MOUNT", "VLLM_PP_LAYER_PARTITION")}
    gang = "10.0.0.9,10.0.0.10"
    for ip, files in (("10.0.0.9", [S1, S2]), ("10.0.0.10", [S2, S3, S4])):
        target = tmp_path / "local" / ip
        run = run_cli(
            *("local", "--source", str(source), "--target", str(target), "--node-ip", ip, "--head-ip", "10.0.0.9"),
            *("--gang-ips", gang, "--gpus-per-node", "2", "--tp", "2", "--pp", "2"),
            env=env,
        )
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert len(lines) == 1
        summary = json.loads(lines[0])
        assert summary["files"] == files and summary["mode"] == "local" and summary["node_ip"] == ip
        assert all(" model-stage: " in line for line in run.stderr.splitlines()), run.stderr
        marker = json.loads((target / model_stage.MARKER_NAME).read_text())
        assert (marker["model"], marker["revision"]) == ("org/tiny", "main")


def test_cli_refuses_with_one_line_naming_the_file_and_the_fix(tmp_path):
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    os.truncate(source / S1, 100)
    run = run_cli(
        *("local", "--source", str(source), "--target", str(tmp_path / "local"), "--node-ip", "10.0.0.1"),
        *("--head-ip", "10.0.0.1", "--gang-ips", "10.0.0.1", "--gpus-per-node", "1", "--tp", "1", "--pp", "1"),
    )
    assert run.returncode == 1 and run.stdout == ""
    assert len(run.stderr.splitlines()) >= 1
    assert S1 in run.stderr.splitlines()[-1] and "model command" in run.stderr.splitlines()[-1]


def stage_on_node(source: Path, local_root: Path, target: Path, instance_store: str) -> subprocess.CompletedProcess:
    """model-stage local as prepare-serve runs it: --local-root and --instance-store from
    node.env's NVME_MOUNT and INSTANCE_STORE, in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PP_LAYER_PARTITION"}
    env.update(NVME_MOUNT=str(local_root), INSTANCE_STORE=instance_store)
    return run_cli(
        *("local", "--source", str(source), "--target", str(target), "--node-ip", "10.0.0.1"),
        *("--head-ip", "10.0.0.1", "--gang-ips", "10.0.0.1", "--gpus-per-node", "1", "--tp", "1", "--pp", "1"),
        env=env,
    )


def test_a_node_with_an_instance_store_never_stages_onto_the_root_volume_beneath_its_mount(tmp_path):
    """Issue 34 point 3: after a stop and start the image mounts the instance store at
    boot; a staging that ran before the mount wrote the stage into the mount point's
    directory on the root volume, which the mount then hid (vLLM found no weights, the
    root volume filled). With an instance store, a local root that is not a mount point
    is refused, naming it, why and what to do; nothing is written there."""
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    root_volume_dir = tmp_path / "opt-dlami-nvme"  # the mount point, nothing mounted on it
    root_volume_dir.mkdir()
    refused = stage_on_node(source, root_volume_dir, root_volume_dir / "vllm-cluster/models/org/tiny/main", "true")
    assert refused.returncode == 1 and refused.stdout == "", (refused.stdout, refused.stderr)
    said = refused.stderr.splitlines()[-1]
    assert f"{root_volume_dir} is not a mount point" in said, said
    assert "instance store" in said and "root volume" in said, said  # why
    assert image.NVME_SETUP_UNIT in said and "prepare-serve --saved" in said, said  # what to do
    assert list(root_volume_dir.iterdir()) == []


def test_a_node_with_an_instance_store_stages_onto_its_mount(tmp_path):
    """The same staging with the store mounted (here /dev/shm, a tmpfs mount point)."""
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    mount = Path("/dev/shm")
    assert os.path.ismount(mount)
    target = Path(tempfile.mkdtemp(dir=mount, prefix="vllm-cluster-test-")) / "org/tiny/main"
    try:
        staged = stage_on_node(source, mount, target, "true")
        assert staged.returncode == 0, staged.stderr
        assert json.loads(staged.stdout)["mode"] == "local"
    finally:
        shutil.rmtree(target.parents[2])


def test_the_node_module_names_the_images_instance_store_unit_as_the_image_facts_do():
    assert model_stage.NVME_SETUP_UNIT == image.NVME_SETUP_UNIT


def test_a_mount_point_is_told_from_a_plain_directory_by_mountinfo_too(tmp_path):
    assert model_stage.is_mount_point(Path("/dev/shm")) and model_stage.is_mount_point(Path("/"))
    assert not model_stage.is_mount_point(tmp_path)
    # A bind mount of the same file system: ismount cannot see it, mountinfo lists it.
    spaced = tmp_path / "a mount"
    spaced.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"36 35 0:1 /x {str(spaced).replace(' ', chr(92) + '040')} rw - ext4 /dev/root rw\n")
    assert model_stage.is_mount_point(spaced, mountinfo)
    assert not model_stage.is_mount_point(tmp_path, mountinfo)


def test_without_an_instance_store_the_local_root_need_not_be_a_mount(tmp_path):
    """A type without an instance store keeps what it did: a local root that exists is
    copied to, one that does not is served through links into the cache."""
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    local_root = tmp_path / "disk"
    local_root.mkdir()
    copied = stage_on_node(source, local_root, local_root / "models/org/tiny/main", "false")
    assert copied.returncode == 0 and json.loads(copied.stdout)["mode"] == "local", copied.stderr
    linked = stage_on_node(source, tmp_path / "absent", tmp_path / "served/org/tiny/main", "false")
    assert linked.returncode == 0 and json.loads(linked.stdout)["mode"] == "cache", linked.stderr


def test_cli_verify_names_every_broken_file(tmp_path):
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    assert run_cli("verify", "--dir", str(source)).returncode == 0
    os.truncate(source / S3, (source / S3).stat().st_size - 4)
    (source / S4).unlink()
    run = run_cli("verify", "--dir", str(source))
    assert run.returncode == 1
    assert f"{S3}: " in run.stderr and "truncated" in run.stderr and f"{S4}: missing" in run.stderr


def test_cli_download_list_parts_cover_the_model_once(tmp_path):
    listing = {f"model-{i}.safetensors": 1000 + i for i in range(7)} | {"config.json": 5}
    (tmp_path / "files.json").write_text(json.dumps(listing))
    seen = []
    for part in range(3):
        run = run_cli(
            "download-list", "--files-json", str(tmp_path / "files.json"), "--parts", "3", "--part", str(part)
        )
        assert run.returncode == 0, run.stderr
        seen += run.stdout.split()
    assert sorted(seen) == sorted(listing)
    assert run_cli(
        "download-list", "--files-json", str(tmp_path / "files.json"), "--parts", "3", "--part", "3"
    ).returncode


def test_check_weight_file_agrees_with_the_safetensors_library(tmp_path):
    """What check_weight_file calls whole, the safetensors library (the testbed's, which vLLM
    loads with) opens; what it calls short or long, the library refuses."""
    python = need_vllm()
    good = tmp_path / "good.safetensors"
    write_safetensors(good, {"a": 100, "b": 7})
    short, long = tmp_path / "short.safetensors", tmp_path / "long.safetensors"
    short.write_bytes(good.read_bytes()[:-3])
    long.write_bytes(good.read_bytes() + b"\0")
    script = textwrap.dedent(
        """
        import json, sys
        from safetensors import safe_open
        result = {}
        for path in sys.argv[1:]:
            try:
                with safe_open(path, framework="numpy") as f:
                    result[path] = sorted(f.keys())
            except Exception as err:
                result[path] = type(err).__name__
        print(json.dumps(result))
        """
    )
    run = subprocess.run([str(python), "-c", script, str(good), str(short), str(long)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    opened = json.loads(run.stdout)
    assert opened[str(good)] == ["a", "b"] and model_stage.check_weight_file(good, {"a", "b"}) is None
    for broken in (short, long):
        assert not isinstance(opened[str(broken)], list) and model_stage.check_weight_file(broken, set())


# --- every byte checked against the Hub's hashes -----------------------------------------


def make_hub_repo(directory: Path) -> Path:
    """make_model's model as the Hub holds it: without hf's .cache/ and our manifest."""
    make_model(directory)
    (directory / MANIFEST).unlink()
    shutil.rmtree(directory / ".cache")
    return directory


def serve_model_hub(root: Path, **options):
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_hf_hub.make_handler(root, None, **options))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def test_the_manifest_takes_each_files_hash_from_the_hubs_tree_across_its_pages(tmp_path):
    model = make_hub_repo(tmp_path / "hub" / "org" / "tiny")
    server, thread = serve_model_hub(tmp_path / "hub", tree_page_size=3)
    try:
        manifest = model_stage.hub_manifest(f"http://127.0.0.1:{server.server_port}", "org/tiny", "main")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    files = manifest["files"]
    assert not any(name.startswith(("original/", ".cache/")) for name in files)
    assert set(files) == {e["path"] for e in hub_tree_of(model) if not e["path"].startswith("original/")}
    # LFS files by the sha256 of their bytes, the others by git's blob id of theirs.
    shard = (model / S1).read_bytes()
    assert files[S1] == {"size": len(shard), "sha256": hashlib.sha256(shard).hexdigest()}
    config = (model / "config.json").read_bytes()
    assert files["config.json"] == {
        "size": len(config),
        "git_blob": hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest(),
    }


def test_a_listing_that_climbs_out_of_the_model_is_refused():
    for path in ("../etc/passwd", "/etc/passwd", "a/../../b", ""):
        entry = {"type": "file", "path": path, "size": 1, "oid": "0" * 40}
        with pytest.raises(model_stage.StageError, match="not a path inside a model"):
            model_stage.manifest_from_tree([entry], model="org/tiny", revision="main")


def test_a_download_whose_bytes_do_not_match_the_hubs_sha256_is_refused_naming_it(tmp_path):
    source = make_model(tmp_path / "models" / "org" / "tiny" / "main")
    manifest = json.loads((source / MANIFEST).read_text())
    assert model_stage.check_files(source, manifest) == []
    same_size_change(source / S3)
    same_size_change(source / "tokenizer.json", at=0)
    problems = model_stage.check_files(source, manifest)
    assert [p.split(":")[0] for p in problems] == [S3, "tokenizer.json"]
    assert "sha256" in problems[0] and "not the Hub's file" in problems[0]
    assert "git_blob" in problems[1]
    run = run_cli("check", "--dir", str(source))
    assert run.returncode == 1 and S3 in run.stderr and "tokenizer.json" in run.stderr, run.stderr


def test_a_file_changed_on_the_cache_after_staging_is_refused_at_the_nodes_copy_naming_it(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    # Its header and size intact: only the hash tells.
    same_size_change(source / S2)
    with pytest.raises(model_stage.StageError, match=f"{S2}: sha256 .* not the Hub's"):
        copy(source, target, [0], 2)
    assert not (target / S2).exists() and not list(target.rglob("*.partial"))
    # A large file, copied in parallel ranges, is hashed as well.
    source2 = make_model(tmp_path / "cache" / "org" / "tiny" / "rev2", values=3000)
    same_size_change(source2 / S1)
    with pytest.raises(model_stage.StageError, match=f"{S1}: sha256 .* not the Hub's"):
        copy(source2, tmp_path / "local2", [0], 2, range_bytes=4096, revision="rev2")


def test_a_small_file_changed_on_the_cache_is_refused_naming_it(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    same_size_change(source / "tokenizer_config.json", at=0)
    with pytest.raises(model_stage.StageError, match="tokenizer_config.json: git_blob .* not the Hub's"):
        copy(source, tmp_path / "local", [1], 2)
    assert not (tmp_path / "local" / "tokenizer_config.json").exists()


def test_a_file_planted_on_the_cache_is_refused_naming_it(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    (source / "modeling_llama.py").write_text("import os; os.system('id')\n")
    with pytest.raises(model_stage.StageError, match="modeling_llama.py is not a file of org/tiny@main"):
        copy(source, tmp_path / "local", [0], 2)
    assert not (tmp_path / "local" / "modeling_llama.py").exists()


def test_a_link_planted_on_the_cache_is_not_followed(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    secret = tmp_path / "etc" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:secret\n")
    (source / "tokenizer.json").unlink()
    (source / "tokenizer.json").symlink_to(secret)
    with pytest.raises(model_stage.StageError, match="tokenizer.json is a link"):
        copy(source, tmp_path / "local", [0], 2)
    copied = [p for p in (tmp_path / "local").rglob("*") if p.is_file()] if (tmp_path / "local").exists() else []
    assert not any(b"root:secret" in p.read_bytes() for p in copied)


def test_a_link_to_a_directory_planted_on_the_cache_is_refused_naming_it(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_text("root:secret\n")
    (source / "tokenizer").symlink_to(tmp_path / "etc")
    with pytest.raises(model_stage.StageError, match="main/tokenizer is a link"):
        copy(source, tmp_path / "local", [0], 2)
    assert not (tmp_path / "local" / "tokenizer").exists()


def test_the_models_directory_swapped_for_a_link_is_not_followed(tmp_path):
    real = make_model(tmp_path / "elsewhere" / "main")
    (tmp_path / "cache" / "org").mkdir(parents=True)
    (tmp_path / "cache" / "org" / "tiny").symlink_to(real.parent)
    with pytest.raises(model_stage.StageError, match="tiny is a link"):
        copy(tmp_path / "cache" / "org" / "tiny" / "main", tmp_path / "local", [0], 2, cache_root=tmp_path / "cache")


def test_a_model_without_the_hubs_hashes_is_refused(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    (source / MANIFEST).unlink()
    with pytest.raises(model_stage.StageError, match=f"{MANIFEST} is missing.*model command"):
        copy(source, tmp_path / "local", [0], 2)


def test_serving_from_the_cache_hashes_the_caches_files(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    assert copy(source, tmp_path / "local", [0], 2, local_root=tmp_path / "nvme")["mode"] == "cache"
    same_size_change(source / S1)
    with pytest.raises(model_stage.StageError, match=f"{S1}: sha256"):
        copy(source, tmp_path / "local", [0], 2, local_root=tmp_path / "nvme")


def test_a_kept_local_file_must_have_been_copied_with_the_hubs_hash_of_now(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    target = tmp_path / "local"
    copy(source, target, [0], 2)
    # The Hub's file changes (same revision name re-staged): the local copy of it is not kept.
    same_size_change(source / S2)
    model_stage.write_manifest(source, hub_manifest_of(source))
    again = copy(source, target, [0], 2)
    assert again["bytes_copied"] == (source / S2).stat().st_size and not again["unchanged"]
    assert (target / S2).read_bytes() == (source / S2).read_bytes()


def test_the_manifest_is_written_through_a_temporary_and_a_rename_never_through_a_link(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    outside = tmp_path / "outside.json"
    outside.write_text("keep\n")
    (source / MANIFEST).unlink()
    (source / MANIFEST).symlink_to(outside)
    model_stage.write_manifest(source, hub_manifest_of(source))
    assert outside.read_text() == "keep\n"
    assert not (source / MANIFEST).is_symlink() and (source / MANIFEST).stat().st_mode & 0o777 == 0o644
    assert json.loads((source / MANIFEST).read_text())["files"][S1]["sha256"]
    assert [p.name for p in source.iterdir() if p.name.endswith(".partial")] == []


def test_cli_manifest_writes_the_hubs_hashes_beside_the_model(tmp_path):
    make_hub_repo(tmp_path / "hub" / "org" / "tiny")
    staged = tmp_path / "models" / "org" / "tiny" / "main"
    staged.mkdir(parents=True)
    server, thread = serve_model_hub(tmp_path / "hub", tree_page_size=2)
    try:
        run = run_cli(
            *("manifest", "--endpoint", f"http://127.0.0.1:{server.server_port}"),
            *("--model", "org/tiny", "--revision", "main", "--dir", str(staged)),
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert run.returncode == 0, run.stderr
    written = json.loads((staged / MANIFEST).read_text())
    assert written == hub_manifest_of(tmp_path / "hub" / "org" / "tiny")


# --- the download is the stage: gang 0's copies while the model lands on the cache --------


def land(hub: Path, cache: Path, name: str) -> None:
    """`name` of the Hub's model onto the cache as hf download puts it: written aside, then
    moved into place whole."""
    aside = cache / ".cache" / "huggingface" / "download" / (name + ".incomplete")
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hub / name, aside)
    os.replace(aside, cache / name)


def test_a_stage_is_copied_file_by_file_while_the_model_still_lands_on_the_cache(tmp_path):
    hub = make_model(tmp_path / "hub" / "org" / "tiny" / "main")
    source = tmp_path / "cache" / "org" / "tiny" / "main"
    target = tmp_path / "local"
    copied_before_the_rest_landed = threading.Event()

    def download() -> None:
        # The directory and its manifest come first (every part writes it before its download).
        source.mkdir(parents=True)
        shutil.copyfile(hub / model_stage.MANIFEST_NAME, source / model_stage.MANIFEST_NAME)
        for name in [*OTHER_FILES, INDEX, S1, S3, S4]:
            land(hub, source, name)
        # Stage 0's other shard lands only once its first is on the local disk: a copy that
        # waited for the whole model would never get there.
        if wait_for(lambda: (target / S1).is_file()):
            copied_before_the_rest_landed.set()
        land(hub, source, S2)

    downloader = threading.Thread(target=download)
    downloader.start()
    try:
        summary = copy(source, target, [0], 2, landing_seconds=30, poll_seconds=0.02)
    finally:
        downloader.join()
    assert copied_before_the_rest_landed.is_set()
    assert summary["mode"] == "local" and summary["files"] == [S1, S2]
    for name in [S1, S2, *OTHER_FILES]:
        assert (target / name).read_bytes() == (hub / name).read_bytes(), name
    assert not (target / S3).exists() and not (target / S4).exists()
    assert weight_map_of(target) == {k: v for k, v in weight_map_of(hub).items() if v in (S1, S2)}


def wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_file_that_never_lands_is_named_after_the_wait(tmp_path):
    hub = make_model(tmp_path / "hub" / "org" / "tiny" / "main")
    source = tmp_path / "cache" / "org" / "tiny" / "main"
    source.mkdir(parents=True)
    shutil.copyfile(hub / model_stage.MANIFEST_NAME, source / model_stage.MANIFEST_NAME)
    for name in [*OTHER_FILES, INDEX, S1]:
        land(hub, source, name)
    # Half of S2: what a download still under way, or stopped, left at its name.
    (source / S2).write_bytes((hub / S2).read_bytes()[:100])
    with pytest.raises(model_stage.StageError, match=f"{S2} did not land on the cache in time: gang 0's nodes"):
        copy(source, tmp_path / "local", [0], 2, landing_seconds=0.3, poll_seconds=0.02)
    assert not list((tmp_path / "local").rglob("*.partial"))


def test_a_landed_file_that_is_not_the_hubs_is_refused_naming_it(tmp_path):
    """The trust boundary holds while the model lands: a file of the manifest's size but
    other bytes (another node's, or a planted one) is hashed at its copy and refused."""
    hub = make_model(tmp_path / "hub" / "org" / "tiny" / "main")
    source = tmp_path / "cache" / "org" / "tiny" / "main"
    source.mkdir(parents=True)
    shutil.copyfile(hub / model_stage.MANIFEST_NAME, source / model_stage.MANIFEST_NAME)
    for name in [*OTHER_FILES, INDEX, S1, S2]:
        land(hub, source, name)
    same_size_change(source / S2)
    with pytest.raises(model_stage.StageError, match=f"{S2}: sha256 .* not the Hub's"):
        copy(source, tmp_path / "local", [0], 2, landing_seconds=5, poll_seconds=0.02)
    assert not (tmp_path / "local" / S2).exists()


def test_a_landing_config_that_is_not_the_hubs_is_refused_before_it_plans_the_stage(tmp_path):
    hub = make_model(tmp_path / "hub" / "org" / "tiny" / "main")
    source = tmp_path / "cache" / "org" / "tiny" / "main"
    source.mkdir(parents=True)
    shutil.copyfile(hub / model_stage.MANIFEST_NAME, source / model_stage.MANIFEST_NAME)
    for name in [*OTHER_FILES, INDEX]:
        land(hub, source, name)
    same_size_change(source / INDEX, at=2)
    with pytest.raises(model_stage.StageError, match=f"{INDEX}: sha256|{INDEX}: git_blob"):
        copy(source, tmp_path / "local", [0], 2, landing_seconds=5, poll_seconds=0.02)


def test_a_landed_model_is_planned_from_its_manifest_as_from_its_files(tmp_path):
    source = make_model(tmp_path / "cache" / "org" / "tiny" / "main")
    listing = {name: e["size"] for name, e in model_stage.load_manifest(source)["files"].items()}
    for stages in ([0], [1], [0, 1]):
        assert model_stage.stage_plan(source, stages, 2, listing=listing) == model_stage.stage_plan(source, stages, 2)

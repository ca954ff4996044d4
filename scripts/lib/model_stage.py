"""model_stage: each node's pipeline stage of the model, copied from the shared cache to
its own disk, and the facts about what vLLM reads that make it worth doing.

Installed at /opt/vllm-cluster/lib/model_stage.py by the nodes' setup command and run
through /opt/vllm-cluster/bin/model-stage (scripts/node/model-stage); the program and the
tests import it as `from scripts.lib import model_stage`. Standard library only: the node
runs it with its virtualenv's Python before vLLM starts.

What vLLM reads while it loads a model
=====================================
Line numbers are vLLM 0.32.0 (the local hosts' build, site-packages/vllm) / 0.33 (the
version the stacks pin, components/versions.py; read from its wheel,
the manylinux_2_28 x86_64 wheel on PyPI). model_loader/ below is
vllm/model_executor/model_loader/; the two versions agree on every point.

1. Which files. `DefaultModelLoader._prepare_weights` globs the model directory for the
   first pattern of "*.safetensors", "*.bin" that matches (model_loader/default_loader.py
   186, 229-235 / the same lines), then keeps only the files that
   `model.safetensors.index.json` names (`filter_duplicate_safetensors_files`,
   default_loader.py 252 / 252; model_loader/weight_utils.py 585-611 / 590-616), which
   RAISES FileNotFoundError when a file the index names is missing (606-608 / 611-613).
   Nothing there looks at the pipeline stage: every worker of every stage gets every file.
   A directory with "consolidated*.safetensors" is loaded in Mistral's format instead
   (default_loader.py 170-181 / the same).
2. How each worker reads them: `safetensors_weights_iterator` (weight_utils.py 1079-1213 /
   1115-1249) walks every file (`sorted_files`, 1098 / 1134) in every worker:
   - `--safetensors-load-strategy eager`: `load(f.read())` of each whole file
     (1171-1176 / 1207-1212): the worker holds one whole file in its memory at a time.
   - lazy (the default None, or "lazy"): `safe_open` (an mmap) and `get_tensor` of every
     name (1207-1213 / 1243-1249): every tensor is copied out, so every page is read.
   - auto-prefetch: with the default None, when the directory is on "nfs", "nfs4" or
     "lustre" (EFS mounts as nfs4) and the files fit in 90% of available RAM
     (1100-1119 / 1136-1155), and always with "prefetch" (1116 / 1152), a background thread
     first reads the files (`_prefetch_all_checkpoints`, 1004-1076 / 1040-1112) and then the
     lazy pass above runs. The prefetch splits the files over the ranks:
     `sorted_files[rank::world_size]` with torch.distributed's global rank and world size
     (1015-1021 / 1051-1057), so across the cluster each file is prefetched once, and a
     node prefetches the files at its own ranks' positions. Its lazy pass still reads every
     tensor of every file, so the rest of the files come over the network too: prefetch
     changes when (earlier, in parallel) the node reads, not how many bytes.
   Only expert-parallel MoE skips tensors before reading them (`local_expert_ids`).
3. Only then does the model drop the other stages' tensors: its load_weights skips names
   of layers it did not build (`is_pp_missing_parameter`, model_executor/models/utils.py
   944-952 / the same), and a parameter no file provided is an error ("Following weights
   were not initialized from checkpoint", default_loader.py 562-566 / 567-571).
So a node serving from the shared cache pulls every weight byte (each once: its workers
share the page cache, if the files fit in it), and each of its workers reads all of them
through the page cache. A directory holding only the files of the node's stages, with an
index naming only those files, cuts both to the stage's bytes: that is what copy_stage
makes.

Which stage a node's workers serve
----------------------------------
- Ranks: rank = pp_rank * TP + tp_rank (distributed/parallel_state.py 2135-2141 /
  2158-2164: the ranks laid out as (-1, DP, PP, PCP, TP)), so pp_rank = rank // TP.
- Worker order with `--distributed-executor-backend ray`: vLLM 0.32 takes RayExecutorV2
  unless VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (envs.py 944-946: default "1";
  v1/executor/abstract.py 77-85); 0.33 has only RayExecutorV2 (abstract.py 76-79). V2
  gives rank i to the i-th GPU bundle of `get_bundles_sorted_by_node`: the driver's node
  (the engine's, the head) first, then the other nodes by their Ray node ID, a random hex
  string a raylet gets when it starts (v1/executor/ray_utils.py 385-442 / 141-198;
  ray_executor_v2.py 306-326 / the same). The older RayDistributedExecutor (0.32 with the
  variable at 0) sorts the driver's node first, then nodes with fewer workers, then by IP
  as a string, so 10.0.0.10 before 10.0.0.9 (v1/executor/ray_executor.py 250-269).
  node_stages follows both.
- Layers: `get_pp_indices` (distributed/utils.py 126-169 / 198-241), honouring
  VLLM_PP_LAYER_PARTITION; `make_layers` builds only the stage's layers with it
  (models/utils.py 886-919). pp_layer_range is a copy.
- Tensors of Llama-like models (llama.py, the same lines in both): `embed_tokens` on the
  first stage, and on the last when tie_word_embeddings (377-388); `norm` (394-397) and
  `lm_head` (502-517) on the last. Qwen2 (qwen2.py 366-397, 479-489), Qwen3 (its model is
  Qwen2's, qwen3.py 269; lm_head 300-316), Mistral (mistral.py 207, 236: Llama's) and
  Granite (granite.py 338-347, 437-455) place them the same way. Mixtral builds
  embed_tokens, norm and lm_head on every stage (mixtral.py 316, 336, 412): only its
  layers are split. Other architectures are not placed: every stage gets every file.
  Any tensor name not placed goes to every stage: a tensor too many costs bytes, one too
  few stops the engine (point 3).

Every byte checked against the Hub
==================================
The Hub names each file's hash in its tree listing at a revision, `GET
/api/models/{repo}/tree/{revision}?recursive=true` (paged: a Link header names the next
page): an LFS file's entry has `lfs: {oid: <sha256 of the file>, size, pointerSize}`,
every entry `oid`, the git blob id (sha1 of "blob <size>\\0" and the bytes; of the LFS
pointer for an LFS file). huggingface_hub 2.4.0, the client the nodes run, reads it so:
hf_api.py `RepoFile.__init__` (blob_id = oid; lfs = BlobLfsInfo(sha256=lfs["oid"])),
`_list_repo_tree_pages` (the URL, 1,000 entries a page) and utils/_pagination.py
(`response.links["next"]`) (github.com/huggingface/huggingface_hub,
src/huggingface_hub/hf_api.py). Its download checks only a file's size
(file_download.py http_get, "Consistency check failed: file should be of size"), so a
file changed on the way or on the shared cache would pass it. Hence:
- `hub_manifest` reads the listing (every page) and `write_manifest` keeps it beside the
  model on the cache (through a temporary and a rename); `check_files` hashes the
  downloaded files against it (model-stage check), a file that does not match is named
  and refused;
- `copy_stage` refuses a model without it, refuses any file the Hub does not list (one
  planted on the cache), any link (never followed: every name under the model's
  directory is opened with O_NOFOLLOW from a descriptor of its directory), and hashes
  every byte it copies: a changed file is refused, naming it, and its partial copy goes.
  In "cache" mode (links into the cache) it hashes the cache's files instead.
What it costs: sha256 runs at about a core's memory speed (hashlib releases the GIL, so
the copy's threads hash files in parallel). A file copied in one range is hashed as it is
copied (one read); a larger one, copied in parallel ranges that a hash cannot follow, is
hashed from the local copy just written, mostly from the page cache: the shared cache is
read once either way. Measured on a 2-core development VM (OpenSSL 3.0 sha256: 726 MiB/s
on one core): 1.6 GB copied from the page cache in 1.7-2.1 s without hashing, 4.3-4.4 s
with it, in 256 MB files (hashed while copied) and in 512 MB files (hashed after) alike;
a node copying from EFS at a few hundred MB/s per stream, with a core per stream, hashes
about as fast as it copies.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME, vLLM's default index_file
MARKER_NAME = ".vllm-cluster-local.json"  # written last; vllm-cluster-node prune_local_models finds copies by it
# The Hub's hash of every file of the model at its revision, written into the model's
# directory on the shared cache when it is staged (write_manifest; module docstring,
# "Every byte checked against the Hub").
MANIFEST_NAME = ".vllm-cluster-manifest.json"
HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub constants.ENDPOINT, HF_ENDPOINT overrides it
HASH_BLOCK_BYTES = 8 << 20  # one read of a file being hashed
PARTIAL_SUFFIX = ".partial"
# Weight files: never copied as "other files"; vLLM reads the first of these patterns that
# matches (default_loader.py 186, 229-235; ".pt" when nothing else matched).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Other frameworks' weights a Hub repository may also hold (TensorFlow, Flax, ONNX, GGUF,
# Core ML...): vLLM's loader of a Hugging Face directory never reads them (point 1 above).
OTHER_FORMAT_SUFFIXES = (".h5", ".msgpack", ".onnx", ".onnx_data", ".gguf", ".ckpt", ".ot", ".tflite", ".mlmodel")
# How often a node whose stage is copied while the model lands looks for the next files.
LANDING_POLL_SECONDS = 2.0
SKIPPED_DIRS = ("original", ".cache")  # the Hub's original/ checkpoints; hf download's metadata
RANGE_BYTES = 256 << 20  # a file larger than this is copied in ranges of this size, in parallel
BLOCK_BYTES = 16 << 20  # one pread/pwrite
FREE_MARGIN = 0.05  # the local disk must hold the stage's bytes plus 5%
PROGRESS_SECONDS = 30.0
# The safetensors format's limit on the header (safetensors, src/tensor.rs MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000

# Architectures whose embed_tokens/norm/lm_head placement was read in vLLM (docstring).
LLAMA_LIKE = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GraniteForCausalLM"}
)
LAYERS_ONLY = frozenset({"MixtralForCausalLM"})
LAYOUTS = ("llama", "layers", "whole")
# --safetensors-load-strategy values (vllm/config/load.py 65-86 / the same); torchao reads as lazy does.
STRATEGIES = (None, "lazy", "eager", "prefetch", "torchao")
NETWORK_FS_PREFETCH_RAM_SHARE = 0.9  # weight_utils.py 1104-1105 / 1140-1141: ram_threshold_pct = 90

# Checkpoint names of the decoder layers, the embeddings, the final norm and the head.
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")
EMBED_PREFIX = "model.embed_tokens."
LAST_STAGE_PREFIXES = ("model.norm.", "lm_head.")


class StageError(Exception):
    """A problem the user fixes: the message names the file and what to do."""


# --- what a node reads ------------------------------------------------------------------


def bytes_read_per_node(
    total_weight_bytes: int,
    stage_bytes: int,
    workers_per_node: int,
    strategy: str | None,
    from_local_copy: bool,
    *,
    stage_links: bool = False,
    available_ram_bytes: int | None = None,
) -> dict:
    """The weight bytes one node reads when vLLM loads the model (module docstring).

    `total_weight_bytes`: every weight file the model's index names (what vLLM reads from
    the whole model directory); `stage_bytes`: the files of this node's stages
    (stage_plan's "stage_bytes"); `from_local_copy`: vLLM serves from copy_stage's local
    copy; `stage_links`: it serves from copy_stage's directory of links into the cache (its
    "cache" mode). Returns:

    - "seen_bytes": the weight bytes in the directory vLLM serves from; every worker
      reads all of them.
    - "from_cache_bytes": what the node pulls from the shared cache over the network: the
      copy (the stage's bytes, once, before vLLM starts; nothing on a later start with the
      copy complete) or vLLM's own reads (seen_bytes once, as the node's workers share its
      page cache; more when the files do not fit in it).
    - "local_disk_bytes": what vLLM reads from the local disk (the copy's bytes, once).
    - "page_cache_bytes": what the node's workers read through the page cache, together:
      workers_per_node x seen_bytes.
    - "prefetch": whether vLLM prefetches first (strategy "prefetch", or the default on the
      network file system when the files fit in 90% of available RAM; None when that
      depends on RAM not given). It does not change the bytes.
    - "sources": where each of these facts is in vLLM.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of vLLM's --safetensors-load-strategy values {STRATEGIES}")
    if workers_per_node < 1 or total_weight_bytes < 0 or not 0 <= stage_bytes <= total_weight_bytes:
        raise ValueError("need workers_per_node >= 1 and 0 <= stage_bytes <= total_weight_bytes")
    if from_local_copy and stage_links:
        raise ValueError("a node serves from its local copy or from links into the cache, not both")
    seen = stage_bytes if (from_local_copy or stage_links) else total_weight_bytes
    on_network_fs = not from_local_copy
    if strategy == "prefetch":
        prefetch: bool | None = True
    elif strategy is None and on_network_fs:
        prefetch = None if available_ram_bytes is None else seen <= NETWORK_FS_PREFETCH_RAM_SHARE * available_ram_bytes
    else:
        prefetch = False
    return {
        "seen_bytes": seen,
        "from_cache_bytes": seen,
        "local_disk_bytes": seen if from_local_copy else 0,
        "page_cache_bytes": workers_per_node * seen,
        "prefetch": prefetch,
        "sources": {
            "every worker reads every file in the directory": "vLLM 0.33 model_loader/default_loader.py 229-235, "
            "252; weight_utils.py 1115-1249 (0.32.0: 1079-1213)",
            "eager reads each whole file": "weight_utils.py 1207-1212 (0.32.0: 1171-1176)",
            "lazy reads every tensor": "weight_utils.py 1243-1249 (0.32.0: 1207-1213)",
            "auto-prefetch on nfs/nfs4/lustre within 90% of RAM": "weight_utils.py 1136-1155 (0.32.0: 1100-1119)",
            "prefetch splits files over ranks": "weight_utils.py 1057 sorted_files[rank::world_size] (0.32.0: 1021)",
        },
    }


# --- pipeline stages --------------------------------------------------------------------


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None) -> tuple[int, int]:
    """The layers [start, end) of pipeline rank `pp_rank`: vLLM's `get_pp_indices`
    (distributed/utils.py 126-169 in 0.32.0, 198-241 in 0.33), with `partition` the value
    of VLLM_PP_LAYER_PARTITION (None when unset). Same errors, same layout: the layers left
    over go one each to the stages before the last, from the second-to-last backwards."""
    if partition is not None:
        try:
            partitions = [int(layer) for layer in partition.split(",")]
        except ValueError as err:
            raise ValueError(f"Invalid partition string: {partition}") from err
        if len(partitions) != pp_size:
            raise ValueError(f"{len(partitions)=} does not match {pp_size=}.")
        if sum(partitions) != num_layers:
            raise ValueError(f"{sum(partitions)=} does not match num_hidden_layers={num_layers}.")
    else:
        per_partition = num_layers // pp_size
        partitions = [per_partition for _ in range(pp_size)]
        if remaining := num_layers % pp_size:
            for i in range(2, remaining + 2):
                partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return (start, start + partitions[pp_rank])


def node_stages(
    node_ips: list[str],
    head_ip: str,
    gpus_per_node: int,
    tensor_parallel: int,
    pipeline_parallel: int,
    *,
    ray_node_ids: dict[str, str] | None = None,
    executor: str = "v2",
) -> dict[str, list[int]]:
    """For each node IP of a gang, the sorted pipeline ranks whose workers run on it.

    One worker per GPU, every node with `gpus_per_node` of them, and vLLM's order (module
    docstring): the head (the driver's node) first; then, with executor "v2" (RayExecutorV2,
    the default of vLLM 0.32 and the only one of 0.33), the other nodes by their Ray node
    ID (`ray_node_ids`: IP -> node ID); with executor "v1" (0.32's RayDistributedExecutor)
    by worker count, then IP as a string. Worker i has pp_rank i // tensor_parallel.

    A Ray node ID exists only once the node's raylet runs, and changes when it restarts.
    Without `ray_node_ids`, v2's order of the nodes after the head is unknown when there are
    two or more: each of them then gets every stage any of them may serve (a superset:
    bytes, never a missing tensor). With one node after the head, nothing is unknown.
    """
    if not node_ips or len(set(node_ips)) != len(node_ips):
        raise ValueError(f"node IPs {node_ips} must be a non-empty list without repeats")
    if head_ip not in node_ips:
        raise ValueError(f"the head {head_ip} is not one of the gang's nodes {node_ips}")
    if min(gpus_per_node, tensor_parallel, pipeline_parallel) < 1:
        raise ValueError("GPUs per node, TP and PP must each be at least 1")
    world = tensor_parallel * pipeline_parallel
    if world != len(node_ips) * gpus_per_node:
        raise ValueError(
            f"TP {tensor_parallel} x PP {pipeline_parallel} = {world} workers, but the gang has {len(node_ips)} "
            f"node(s) x {gpus_per_node} GPUs = {len(node_ips) * gpus_per_node}: vLLM places one worker per GPU "
            "(v1/executor/ray_utils.py initialize_ray_cluster); set tensorParallel x pipelineParallel to nodes x GPUs"
        )
    others = [ip for ip in node_ips if ip != head_ip]
    unknown = False
    if executor == "v1":
        # ray_executor.py 250-269: (driver first, workers on the node, IP as a string).
        order = sorted(node_ips, key=lambda ip: (0 if ip == head_ip else 1, gpus_per_node, ip))
    elif executor == "v2":
        if ray_node_ids is not None:
            missing = [ip for ip in node_ips if ip not in ray_node_ids]
            if missing:
                raise ValueError(f"no Ray node ID for {', '.join(missing)}")
            # ray_utils.py 434-440 (0.32.0) / 190-196 (0.33): (driver's node first, node ID).
            order = sorted(node_ips, key=lambda ip: (0 if ip == head_ip else 1, ray_node_ids[ip]))
        else:
            order = [head_ip, *sorted(others)]
            unknown = len(others) > 1
    else:
        raise ValueError(f"executor {executor!r} is not 'v2' (RayExecutorV2) or 'v1' (RayDistributedExecutor)")
    stages = {
        ip: sorted({rank // tensor_parallel for rank in range(p * gpus_per_node, (p + 1) * gpus_per_node)})
        for p, ip in enumerate(order)
    }
    if unknown:
        pool = sorted({stage for ip in others for stage in stages[ip]})
        stages.update({ip: pool for ip in others})
    return {ip: stages[ip] for ip in node_ips}


def model_layout(config: dict) -> tuple[int, bool]:
    """(num_hidden_layers, tie_word_embeddings) of a config.json; a nested `text_config`
    (multimodal models) holds the language model's layers, as vLLM's hf_text_config does.
    An absent tie_word_embeddings counts as tied: the embedding's file then also goes to
    the last stage (bytes, never a missing tensor)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    layers = text.get("num_hidden_layers", config.get("num_hidden_layers"))
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"config.json has no usable num_hidden_layers ({layers!r})")
    if "tie_word_embeddings" in config:
        tied = config["tie_word_embeddings"]
    else:
        tied = text.get("tie_word_embeddings", True)
    return layers, bool(tied)


def placement(config: dict) -> tuple[str, str]:
    """(layout, why) for tensor_stages: "llama" for the architectures whose placement was
    read in vLLM (module docstring), "layers" for those that split only their layers,
    "whole" (every file on every stage) for any other."""
    architectures = config.get("architectures") or []
    if architectures and all(name in LLAMA_LIKE for name in architectures):
        return "llama", f"{', '.join(architectures)}: layers, embeddings, norm and head by stage"
    if architectures and all(name in LAYERS_ONLY | LLAMA_LIKE for name in architectures):
        return "layers", f"{', '.join(architectures)}: layers by stage, the rest on every stage"
    return "whole", f"{', '.join(architectures) or 'no architecture'}: placement not known, every stage gets every file"


def _stage_ranges(num_layers: int, pp_size: int, partition: str | None) -> list[tuple[int, int]]:
    return [pp_layer_range(num_layers, rank, pp_size, partition) for rank in range(pp_size)]


def tensor_stages(
    name: str,
    num_layers: int,
    pp_size: int,
    tied_embeddings: bool,
    partition: str | None = None,
    *,
    layout: str = "llama",
) -> set[int]:
    """The pipeline stages that need the checkpoint tensor `name` (module docstring):
    `model.layers.N.*` the stage of layer N; with layout "llama" `model.embed_tokens.*` the
    first stage (and the last when tied), `model.norm.*` and `lm_head.*` the last; any
    other name, or any name under layout "whole", every stage."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    every = set(range(pp_size))
    if layout == "whole":
        return every
    match = LAYER_NAME.match(name)
    if match:
        layer = int(match.group(1))
        for rank, (start, end) in enumerate(_stage_ranges(num_layers, pp_size, partition)):
            if start <= layer < end:
                return {rank}
        return every  # a layer past num_hidden_layers (an MTP layer, say): not placed
    if layout == "llama":
        if name.startswith(EMBED_PREFIX):
            return {0, pp_size - 1} if tied_embeddings else {0}
        if name.startswith(LAST_STAGE_PREFIXES):
            return {pp_size - 1}
    return every


def stage_files(
    weight_map: dict[str, str],
    stages: Iterable[int],
    num_layers: int,
    pp_size: int,
    tied_embeddings: bool,
    partition: str | None = None,
    *,
    layout: str = "llama",
) -> list[str]:
    """The sorted weight files of an index's `weight_map` holding a tensor any of `stages`
    needs."""
    wanted = set(stages)
    if not wanted or not wanted <= set(range(pp_size)):
        raise ValueError(f"stages {sorted(wanted)} must be some of 0..{pp_size - 1}")
    _stage_ranges(num_layers, pp_size, partition)  # a bad partition fails here, even without layer tensors
    return sorted(
        {
            file
            for name, file in weight_map.items()
            if wanted & tensor_stages(name, num_layers, pp_size, tied_embeddings, partition, layout=layout)
        }
    )


def stage_index(index: dict, files: Iterable[str]) -> dict:
    """The index `index` (model.safetensors.index.json) for a directory holding only
    `files`: its weight_map keeps the tensors of those files; "metadata" and any other key
    stay as they are. vLLM requires every file the index names (filter_duplicate_safetensors_files)."""
    keep = set(files)
    return {**index, "weight_map": {name: file for name, file in index["weight_map"].items() if file in keep}}


# --- safetensors checks -----------------------------------------------------------------


def read_header(path: str | os.PathLike) -> tuple[int, dict]:
    """(header length, header) of a safetensors file: an 8-byte little-endian length, then
    that many bytes of JSON (https://github.com/huggingface/safetensors#format). ValueError
    when the file is too short or the header is not one."""
    with open(path, "rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ValueError(f"{len(head)} bytes: too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"header length {length} is over safetensors' limit: not a safetensors file")
        raw = file.read(length)
    if len(raw) < length:
        raise ValueError(f"its header is cut short ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"its header is not JSON ({err})") from err
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return length, header


def expected_file_size(path: str | os.PathLike) -> int:
    """The size a safetensors file has by its own header: 8 + header length + the largest
    end of its tensors' data_offsets."""
    return _size_by_header(*read_header(path))


def _size_by_header(length: int, header: dict) -> int:
    ends = [0]
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            ends.append(int(entry["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError) as err:
            raise ValueError(f"tensor {name} has no data_offsets in the header") from err
    return 8 + length + max(ends)


def check_weight_file(path: str | os.PathLike, tensors_expected: set[str]) -> str | None:
    """A problem with a weight file, as text naming it, or None. A safetensors file must
    have exactly the size its header says (the safetensors library refuses any other) and
    hold every tensor in `tensors_expected` (the index's for that file)."""
    path = Path(path)
    if not path.is_file():
        return f"{path.name}: missing"
    if not path.name.removesuffix(PARTIAL_SUFFIX).endswith(".safetensors"):
        return None
    try:
        length, header = read_header(path)
        expected = _size_by_header(length, header)
    except (OSError, ValueError) as err:
        return f"{path.name}: {err}"
    size = path.stat().st_size
    if size < expected:
        return f"{path.name}: {size} bytes, its header says {expected}: truncated"
    if size > expected:
        return f"{path.name}: {size} bytes, its header says {expected}: longer than its tensors"
    missing = sorted(tensors_expected - header.keys())
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"{path.name}: the index's tensors {', '.join(missing[:3])}{more} are not in it"
    return None


def verify_model_dir(directory: str | os.PathLike) -> list[str]:
    """The problems of a complete model directory: every file its index names (or, without
    an index, every top-level safetensors file) present, whole, with the index's tensors."""
    directory = Path(directory)
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            return [f"{INDEX_NAME}: not a safetensors index ({err})"]
        tensors: dict[str, set[str]] = {}
        for name, file in weight_map.items():
            tensors.setdefault(file, set()).add(name)
    else:
        tensors = {path.name: set() for path in directory.glob("*.safetensors")}
    return [problem for file in sorted(tensors) if (problem := check_weight_file(directory / file, tensors[file]))]


# --- the first download -----------------------------------------------------------------


def split_for_download(sizes: dict[str, int], parts: int) -> list[list[str]]:
    """`parts` disjoint lists of the file names of `sizes` (name -> bytes), together every
    name once, balanced by bytes: the largest file first onto the lightest part (ties: by
    name, onto the lower part). Each list sorted; some are empty with fewer files than parts."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    loads = [0] * parts
    split: list[list[str]] = [[] for _ in range(parts)]
    for name, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        lightest = min(range(parts), key=lambda part: (loads[part], part))
        split[lightest].append(name)
        loads[lightest] += size
    return [sorted(names) for names in split]


# --- the Hub's hashes -------------------------------------------------------------------

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def _safe_relative(path: object) -> str:
    """A file's path as the Hub lists it, when it stays inside the model's directory."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise StageError(f"the Hub's listing names a file {path!r}: not a path inside a model")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise StageError(f"the Hub's listing names a file {path!r}: not a path inside a model")
    return path


def manifest_from_tree(entries: Iterable[dict], *, model: str, revision: str) -> dict:
    """The manifest of a model from the Hub's tree entries (module docstring): every file
    but original/'s (the checkpoint in its training format, never downloaded) with its size
    and the Hub's hash, "sha256" for an LFS file, else "git_blob" (the git blob id)."""
    files: dict[str, dict] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") != "file":
            continue
        path = _safe_relative(entry.get("path"))
        if path.split("/")[0] in SKIPPED_DIRS:
            continue
        lfs = entry.get("lfs")
        if lfs:
            expect = {"size": lfs.get("size"), "sha256": lfs.get("oid")}
            good = _SHA256.match(str(expect["sha256"]))
        else:
            expect = {"size": entry.get("size"), "git_blob": entry.get("oid")}
            good = _SHA1.match(str(expect["git_blob"]))
        if not good or not isinstance(expect["size"], int) or expect["size"] < 0:
            raise StageError(f"the Hub's listing of {model}@{revision} gives {path} no usable size and hash: {entry}")
        files[path] = expect
    if not files:
        raise StageError(f"the Hub listed no files for {model}@{revision}: check model and modelRevision")
    return {"model": model, "revision": revision, "files": dict(sorted(files.items()))}


def fetch_hub_tree(
    endpoint: str, repo: str, revision: str, token: str | None = None, timeout: float = 60.0
) -> list[dict]:
    """Every entry of the repository's tree at `revision`, following the Hub's pages (a
    Link header's rel="next", huggingface_hub utils/_pagination.py). The token goes to
    the endpoint's own host only, never to a page another host names."""
    base = urllib.parse.urlsplit(endpoint)
    url = (
        f"{endpoint.rstrip('/')}/api/models/{urllib.parse.quote(repo, safe='/')}/tree/"
        f"{urllib.parse.quote(revision, safe='')}?recursive=true"
    )
    entries: list[dict] = []
    while url:
        page_url = urllib.parse.urlsplit(url)
        if (page_url.scheme, page_url.netloc) != (base.scheme, base.netloc):
            raise StageError(f"the Hub's next page {url} is not on {endpoint}: refused")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
                page = json.load(response)
                link = response.headers.get("Link", "")
        except (OSError, ValueError) as err:
            raise StageError(
                f"listing {repo}@{revision} on {endpoint} failed ({err}): check model, modelRevision and hfToken"
            ) from err
        if not isinstance(page, list):
            raise StageError(f"the Hub's tree of {repo}@{revision} is not a list: {str(page)[:200]}")
        entries.extend(page)
        match = _NEXT_LINK.search(link)
        url = urllib.parse.urljoin(url, match.group(1)) if match else ""
    return entries


def hub_manifest(endpoint: str, repo: str, revision: str, token: str | None = None) -> dict:
    """The manifest of `repo` at `revision` as the Hub lists it now."""
    return manifest_from_tree(fetch_hub_tree(endpoint, repo, revision, token), model=repo, revision=revision)


def _open_dir_nofollow(path: str | os.PathLike, trusted: str | os.PathLike | None = None) -> int:
    """A descriptor of the directory `path`, no component of it below `trusted` (the host's
    own mount of the shared cache; default: `path`'s parent) a link: each is opened with
    O_NOFOLLOW|O_DIRECTORY from its parent's descriptor, so another node cannot point it
    elsewhere by swapping a directory for a link."""
    path = Path(os.path.abspath(path))
    trusted = Path(os.path.abspath(trusted)) if trusted is not None else path.parent
    if trusted != path and trusted not in path.parents:
        raise StageError(f"{path} is not under the cache's {trusted}")
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.relative_to(trusted).parts:
            child = _open_nofollow(fd, part, directory=True, shown=path)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_nofollow(dir_fd: int, name: str, *, directory: bool = False, shown: Path | str = "") -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0)
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StageError(
                f"{shown or name}: {name} is a link or not a {'directory' if directory else 'file'} on the cache; "
                "nothing there is followed: remove it and run the model command again"
            ) from err
        raise


def _open_beneath(dir_fd: int, relative: str, shown: Path | str = "") -> int:
    """A regular file `relative` ("/"-separated) under the directory `dir_fd`, no component
    of it a link (each opened with O_NOFOLLOW from its parent's descriptor)."""
    parts = relative.split("/")
    fd = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            child = _open_nofollow(fd, part, directory=True, shown=shown or relative)
            os.close(fd)
            fd = child
        file_fd = _open_nofollow(fd, parts[-1], shown=shown or relative)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise StageError(f"{shown or relative} is not a regular file on the cache: remove it and run the model command")
    return file_fd


def new_hash(expect: dict):
    """The hash object the Hub's hash of a file is, before any of its bytes: sha256, or
    git's blob id (sha1 of "blob <size>\\0" and then the bytes)."""
    if "sha256" in expect:
        return hashlib.sha256()
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % expect["size"])
    return digest


def hash_problem(name: str, expect: dict, size: int, hexdigest: str | None) -> str | None:
    """What is wrong with a file of `size` bytes and this hash, as text naming it, or None."""
    kind = "sha256" if "sha256" in expect else "git_blob"
    if size != expect["size"]:
        return f"{name}: {size} bytes, the Hub's file has {expect['size']}"
    if hexdigest != expect[kind]:
        return f"{name}: {kind} {hexdigest}, the Hub's is {expect[kind]}: not the Hub's file"
    return None


def hash_fd(fd: int, expect: dict) -> tuple[int, str]:
    """(size, hex digest) of the whole file open at `fd`, read from its start."""
    digest, position = new_hash(expect), 0
    while block := os.pread(fd, HASH_BLOCK_BYTES, position):
        digest.update(block)
        position += len(block)
    return position, digest.hexdigest()


def load_manifest(directory: str | os.PathLike) -> dict:
    """The manifest beside a model in `directory` (MANIFEST_NAME), never through a link."""
    dir_fd = _open_dir_nofollow(directory)
    try:
        return read_manifest(dir_fd, Path(directory))
    finally:
        os.close(dir_fd)


def check_files(
    directory: str | os.PathLike, manifest: dict, names: Iterable[str] | None = None, *, workers: int = 8
) -> list[str]:
    """The problems (text naming each file) of `names` (default: every file of the
    manifest) in `directory` against the Hub's hashes: missing, a link, another size or
    another hash. Files are hashed `workers` at a time."""
    dir_fd = _open_dir_nofollow(directory)
    try:
        return _check_at(dir_fd, manifest, names, workers=workers)
    finally:
        os.close(dir_fd)


def _check_at(dir_fd: int, manifest: dict, names: Iterable[str] | None, *, workers: int) -> list[str]:
    wanted = sorted(manifest["files"] if names is None else set(names))

    def one(name: str) -> str | None:
        expect = manifest["files"].get(name)
        if expect is None:
            return f"{name}: not in the Hub's listing of {manifest['model']}@{manifest['revision']}"
        try:
            fd = _open_beneath(dir_fd, name)
        except FileNotFoundError:
            return f"{name}: missing"
        except StageError as err:
            return str(err)
        try:
            return hash_problem(name, expect, *hash_fd(fd, expect))
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return [problem for problem in pool.map(one, wanted) if problem]


def write_manifest(directory: str | os.PathLike, manifest: dict) -> None:
    """`manifest` as the directory's MANIFEST_NAME, through a temporary of a name of its
    own (O_EXCL|O_NOFOLLOW, fchmod) and a rename, which replaces a link planted there
    rather than writing through it: a reader sees the old manifest or the new, whole."""
    dir_fd = _open_dir_nofollow(directory)
    temp = f"{MANIFEST_NAME}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o644)  # not a secret; the umask does not decide it
            with os.fdopen(os.dup(fd), "w") as file:
                file.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            os.fsync(fd)
            os.replace(temp, MANIFEST_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(temp, dir_fd=dir_fd)  # made above (O_EXCL), not renamed: ours to remove
            raise
        finally:
            os.close(fd)
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_manifest(dir_fd: int, shown: Path | str) -> dict:
    """The manifest in the directory `dir_fd` (`shown` names it), checked for shape."""
    fix = "run the model command again (it lists the model's hashes on the Hub and checks the files)"
    try:
        fd = _open_beneath(dir_fd, MANIFEST_NAME, shown=f"{shown}/{MANIFEST_NAME}")
    except FileNotFoundError as err:
        raise StageError(
            f"{shown}/{MANIFEST_NAME} is missing: the Hub's hashes of the model are unknown; {fix}"
        ) from err
    try:
        with os.fdopen(fd, "rb") as file:
            manifest = json.load(file)
    except ValueError as err:
        raise StageError(f"{shown}/{MANIFEST_NAME} is not JSON ({err}); {fix}") from err
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and ("sha256" in e or "git_blob" in e)
        for e in files.values()
    ):
        raise StageError(f"{shown}/{MANIFEST_NAME} is not a manifest of the Hub's hashes; {fix}")
    return manifest


def tree_files(dir_fd: int, shown: Path | str) -> list[str]:
    """Every regular file under the directory `dir_fd` ("/"-separated, sorted) but in
    original/ and .cache/ (SKIPPED_DIRS), walked through descriptors (os.fwalk, which
    opens each directory from its parent's and checks it is the one listed) and never
    through a link: a link anywhere is refused, naming it."""
    found = []
    for root, dirs, files, _root_fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        relative = "" if root == "." else root[2:] + "/"
        if not relative:
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        dirs[:] = [d for d in dirs if d != ".cache"]
        # os.fwalk lists a link to a directory among the directories and skips it: named here.
        for name in [*dirs, *files]:
            info = os.stat(name, dir_fd=_root_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise StageError(
                    f"{shown}/{relative}{name} is a link on the cache: nothing there is followed; "
                    "remove it and run the model command again"
                )
            if stat.S_ISREG(info.st_mode) and name in files:
                found.append(relative + name)
    return sorted(found)


# --- the stage's copy -------------------------------------------------------------------


def _is_weight(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def _other_files(source: Path) -> list[str]:
    """Every file vLLM may need besides the weights (config, tokenizer, chat template,
    generation config, code), relative to `source`, sorted. Walked through descriptors
    (os.fwalk: each directory opened from its parent's, never through a link)."""
    found = []
    # `source` itself may be copy_stage's /proc/self/fd/N, a link to the directory it opened.
    source_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for root, dirs, files, root_fd in os.fwalk(".", dir_fd=source_fd, follow_symlinks=False):
            relative_root = Path(root)
            if relative_root == Path("."):
                dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
            dirs[:] = [d for d in dirs if d != ".cache"]
            for name in files:
                relative = (relative_root / name).as_posix()
                if not stat.S_ISREG(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode):
                    continue  # a link (copy_stage refuses it first) or a socket: never a file of the model
                if _is_other_file(relative):
                    found.append(relative)
    finally:
        os.close(source_fd)
    return sorted(found)


def _is_other_file(relative: str) -> bool:
    """Whether the model's file `relative` is one vLLM may read besides the weights."""
    name = relative.rsplit("/", 1)[-1]
    if relative.split("/")[0] in SKIPPED_DIRS or "/.cache/" in f"/{relative}":
        return False
    if relative in (INDEX_NAME, MARKER_NAME, MANIFEST_NAME) or name.endswith(PARTIAL_SUFFIX):
        return False
    return not (_is_weight(name) or name.endswith(OTHER_FORMAT_SUFFIXES))


def stage_plan(
    source_dir: str | os.PathLike,
    stages: Iterable[int],
    pp_size: int,
    partition: str | None = None,
    listing: dict[str, int] | None = None,
) -> dict:
    """What a node with `stages` (of `pp_size`) needs of the model in `source_dir`:
    "weights" (the weight files, sorted), "others" (every other file vLLM may read),
    "sizes" (each file's bytes), "tensors" (weight file -> the index's tensors in it),
    "index" (the stage's own model.safetensors.index.json, or None without one), "layout"
    and "layout_reason", "stage_bytes" (its weight files) and "total_weight_bytes" (every
    weight file vLLM reads from the whole directory). With `listing` ({name: bytes}, the
    manifest's: the model while it still lands on the cache) the files and their sizes are
    the listing's, and only config.json and the index are read from `source_dir`."""
    source = Path(source_dir)
    config_path = source / "config.json"
    if not config_path.is_file():
        raise StageError(
            f"{config_path} is missing: {source} is not a complete model directory; "
            "run the model command again (it stages the model on the cache)"
        )
    config = _read_json(config_path)
    try:
        num_layers, tied = model_layout(config)
    except ValueError as err:
        raise StageError(f"{config_path}: {err}; vLLM cannot serve it either: check the model") from err
    layout, why = placement(config)
    wanted = sorted(set(stages))
    if not wanted or not set(wanted) <= set(range(pp_size)):
        raise ValueError(f"stages {wanted} must be some of 0..{pp_size - 1}")
    if listing is None:
        top = sorted(path.name for path in source.iterdir() if path.is_file() and not path.is_symlink())
    else:
        top = sorted(name for name in listing if "/" not in name)
    safetensors = [name for name in top if name.endswith(".safetensors")]
    index_path = source / INDEX_NAME
    index = None
    tensors: dict[str, set[str]] = {}
    if safetensors:
        if any(name.startswith("consolidated") for name in safetensors):
            # vLLM loads Mistral's consolidated format from such a directory (default_loader.py 170-181).
            layout, why = "whole", "consolidated*.safetensors (Mistral's format): every stage gets every file"
        if index_path.is_file():
            full = _read_json(index_path)
            weight_map = full.get("weight_map")
            if not isinstance(weight_map, dict):
                raise StageError(
                    f"{index_path} has no weight_map: the model on the cache is broken; run the model command again"
                )
            for name, file in weight_map.items():
                tensors.setdefault(file, set()).add(name)
            missing = sorted(set(tensors) - set(safetensors))
            if missing:
                raise StageError(
                    f"{source}/{missing[0]} is missing but {INDEX_NAME} names it: the model on the cache is "
                    "incomplete; run the model command again"
                )
            every_file = sorted(tensors)
            if layout == "whole":
                weights = every_file
            else:
                weights = stage_files(weight_map, wanted, num_layers, pp_size, tied, partition, layout=layout)
            index = stage_index(full, weights)
        else:
            every_file = weights = safetensors  # no index: vLLM reads them all, on every stage
            tensors = {name: set() for name in safetensors}
            layout, why = "whole", f"no {INDEX_NAME}: every stage gets every weight file"
    else:
        every_file = weights = [name for name in top if name.endswith(".bin")] or [
            name for name in top if name.endswith(".pt")
        ]
        tensors = {name: set() for name in weights}
        layout, why = "whole", "no safetensors files: every stage gets every weight file"
    if not weights:
        raise StageError(f"{source} holds no weight files: run the model command again")
    if listing is None:
        others = _other_files(source)
        sizes = {name: (source / name).stat().st_size for name in [*every_file, *others]}
    else:
        others = sorted(name for name in listing if _is_other_file(name))
        sizes = {name: listing[name] for name in [*every_file, *others]}
    return {
        "stages": wanted,
        "weights": weights,
        "others": others,
        "sizes": sizes,
        "tensors": {name: tensors.get(name, set()) for name in weights},
        "index": index,
        "layout": layout,
        "layout_reason": why,
        "stage_bytes": sum(sizes[name] for name in weights),
        "total_weight_bytes": sum(sizes[name] for name in every_file),
    }


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise StageError(
            f"{path} is not JSON ({err}): the model on the cache is broken; run the model command again"
        ) from err
    if not isinstance(data, dict):
        raise StageError(f"{path} is not a JSON object: the model on the cache is broken; run the model command again")
    return data


def _read_marker(target: Path) -> dict | None:
    try:
        marker = json.loads((target / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _write_json(path: Path, data: dict) -> int:
    """Write `data` to `path` atomically and durably; its size."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    # A temporary and a rename: a reader sees the old marker or the new one, whole.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    return len(text.encode())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _entries(target: Path) -> list[Path]:
    """Every file or link under `target` (links not followed)."""
    found = []
    for root, _dirs, files in os.walk(target):
        found.extend(Path(root) / name for name in files)
    return found


def _remove_empty_dirs(target: Path) -> None:
    for root, dirs, _files in os.walk(target, topdown=False):
        for name in dirs:
            path = Path(root) / name
            if not path.is_symlink() and not any(path.iterdir()):
                path.rmdir()


class _Copier:
    """Copies files with `streams` threads: each file into NAME.partial, larger ones in
    ranges copied in parallel (os.pread/os.pwrite), then checked, fsynced and renamed."""

    def __init__(self, streams: int, range_bytes: int, say: Callable[[str], None], progress_seconds: float):
        self.streams = max(1, streams)
        self.range_bytes = max(1, range_bytes)
        self.say = say
        self.progress_seconds = progress_seconds
        self.copied = 0
        self.lock = threading.Lock()

    def _copy_range(self, job: dict, offset: int, length: int) -> None:
        # The source was opened once, without following a link (copy_stage); the ranges share it.
        src, digest = job["source_fd"], job.get("digest")
        dst = os.open(job["partial"], os.O_WRONLY | os.O_NOFOLLOW)
        try:
            position, end = offset, offset + length
            while position < end:
                block = os.pread(src, min(BLOCK_BYTES, end - position), position)
                if not block:
                    raise StageError(
                        f"{job['shown']} ended at {position} bytes, short of {end}: the cache's copy changed or is "
                        "truncated; run the model command again, then this one"
                    )
                if digest is not None:
                    digest.update(block)  # one range: hashed as it is copied, in order
                view, written = memoryview(block), 0
                while written < len(block):
                    written += os.pwrite(dst, view[written:], position + written)
                position += len(block)
                with self.lock:
                    self.copied += len(block)
        finally:
            os.close(dst)

    @staticmethod
    def _finish(job: dict) -> None:
        partial, final = job["partial"], job["final"]
        fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
            if job.get("digest") is not None:
                found = (os.fstat(fd).st_size, job["digest"].hexdigest())
            else:
                # Copied in parallel ranges, which a hash cannot follow: hashed from the
                # local copy just written (mostly the page cache), the cache read once.
                found = hash_fd(fd, job["expect"])
        finally:
            os.close(fd)
        problem = hash_problem(job["name"], job["expect"], *found)
        if problem:
            raise StageError(
                f"{job['shown'].parent}/{problem}: the cache's copy is not the Hub's (changed after it was "
                "checked); remove it and the model's completion marker (complete/<model>/<revision> on the cache) "
                "and run the model command again"
            )
        if job["safetensors"]:
            problem = check_weight_file(partial, job["tensors"])
        else:
            size = partial.stat().st_size
            problem = (
                None if size == job["size"] else f"{job['name']}: {size} bytes copied, the cache has {job['size']}"
            )
        if problem:
            raise StageError(f"the copy of {job['name']} is not whole ({problem}); run this command again")
        os.replace(partial, final)

    def run(self, jobs: list[dict]) -> None:
        total = sum(job["size"] for job in jobs)
        start = time.monotonic()
        next_tick = start + self.progress_seconds
        for job in jobs:
            job["final"].parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(job["partial"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644))
            # A file copied in one range is hashed while it is copied (one read, in order).
            job["digest"] = new_hash(job["expect"]) if job["size"] <= self.range_bytes else None
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.streams, thread_name_prefix="model-stage")
        pending: dict[concurrent.futures.Future, tuple[str, dict]] = {}
        remaining: dict[str, int] = {}
        finished = 0
        try:
            for job in sorted(jobs, key=lambda job: (-job["size"], job["name"])):
                offsets = range(0, job["size"], self.range_bytes)
                remaining[job["name"]] = len(offsets)
                if not offsets:
                    pending[pool.submit(self._finish, job)] = ("finish", job)
                for offset in offsets:
                    length = min(self.range_bytes, job["size"] - offset)
                    future = pool.submit(self._copy_range, job, offset, length)
                    pending[future] = ("range", job)
            while pending:
                timeout = max(0.0, next_tick - time.monotonic())
                done, _ = concurrent.futures.wait(
                    pending, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    kind, job = pending.pop(future)
                    future.result()  # a failed range or check ends the copy
                    if kind == "range":
                        remaining[job["name"]] -= 1
                        if remaining[job["name"]] == 0:
                            pending[pool.submit(self._finish, job)] = ("finish", job)
                    else:
                        finished += 1
                now = time.monotonic()
                if now >= next_tick:
                    with self.lock:
                        copied = self.copied
                    rate = copied / max(now - start, 1e-9) / 1e6
                    self.say(
                        f"copied {copied / 1e6:.0f} of {total / 1e6:.0f} MB ({finished} of {len(jobs)} files) "
                        f"in {now - start:.0f} s, {rate:.0f} MB/s"
                    )
                    next_tick = now + self.progress_seconds
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            for job in jobs:
                job["partial"].unlink(missing_ok=True)
            raise
        pool.shutdown(wait=True)


# The image's unit that mounts the instance store at boot (components/image.py
# NVME_SETUP_UNIT; this module runs on the node and imports nothing of the program's,
# tests/test_model_stage.py holds the two equal).
NVME_SETUP_UNIT = "dlami-nvme.service"


def is_mount_point(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether something is mounted at `path`: os.path.ismount (another device than its
    parent's), or a line of /proc/self/mountinfo (a bind mount of the same file system,
    which ismount cannot see; its fifth field is the mount point, spaces and the like
    written as octal escapes, proc(5))."""
    if os.path.ismount(path):
        return True
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return False
    escaped = re.sub(r"[ \t\n\\]", lambda m: f"\\{ord(m.group()):03o}", str(path))
    return any(len(fields) > 4 and fields[4] == escaped for fields in (line.split(" ") for line in lines))


def require_mounted(local_root: str | os.PathLike | None, target_dir: str | os.PathLike) -> None:
    """Refuse a stage for a node whose instance type has an instance store unless
    `local_root` is a mount point and `target_dir` lies beneath it. The image mounts the
    store there at every boot (NVME_SETUP_UNIT); before it has, or when it failed, the
    directory is the mount point on the root volume: a copy there fills the root volume and
    the mount then hides it, so vLLM finds no weights after a stop and start."""
    if local_root is None:
        raise StageError("the node's instance type has an instance store, but no --local-root (its mount) was given")
    root = Path(os.path.abspath(local_root))
    target = Path(os.path.abspath(target_dir))
    if root != target and root not in target.parents:
        raise StageError(f"--target {target} is not on the instance store's mount {root}: stage it under {root}")
    if not is_mount_point(root):
        raise StageError(
            f"{root} is not a mount point: this node's instance type has an instance store, which the image "
            f"mounts there at boot ({NVME_SETUP_UNIT}), and a stage copied now would go onto the root volume, "
            f"hidden once the store is mounted over it. Nothing was copied. Fix: see why it is not mounted "
            f"(systemctl status {NVME_SETUP_UNIT}; journalctl -b -u {NVME_SETUP_UNIT}) or mount the store there "
            "(on your own hosts, your NVMe), then run: sudo /opt/vllm-cluster/bin/vllm-cluster-node "
            "prepare-serve --saved"
        )


def copy_stage(
    source_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    stages: Iterable[int],
    pp_size: int,
    model: str,
    revision: str,
    partition: str | None = None,
    streams: int = 8,
    progress: Callable[[str], None] | None = None,
    local_root: str | os.PathLike | None = None,
    range_bytes: int = RANGE_BYTES,
    progress_seconds: float = PROGRESS_SECONDS,
    cache_root: str | os.PathLike | None = None,
    instance_store: bool = False,
    landing_seconds: float = 0.0,
    poll_seconds: float = LANDING_POLL_SECONDS,
) -> dict:
    """Make `target_dir` the directory vLLM serves this node's `stages` from: the model's
    other files, only the stages' weight files and the stages' own index, copied from the
    cache's `source_dir` with `streams` parallel streams, each checked before it is
    accepted, and a marker (.vllm-cluster-local.json) written last.

    A complete copy (same model, revision, source, stages and partition, every file there
    with its size) is not copied again. A copy of the same revision keeps its whole files
    (another stage: only the missing ones are copied); any other content is removed first.
    When `local_root` (the local disk's mount) does not exist, or the target's file system
    lacks room for the bytes to copy plus 5%, nothing is copied: the target becomes links
    to the cache's files (the same stage file set, its own index), mode "cache". With
    `instance_store` (the node's type has one, mounted at `local_root` at boot), a
    `local_root` that is not a mount point is refused before anything is written
    (require_mounted): the stage would land on the root volume, under the mount.

    Every file must be one the Hub lists in the model's manifest (MANIFEST_NAME, written
    when it was staged) and have its hash there: each copied byte is hashed (module
    docstring, "Every byte checked against the Hub"); a file that is not, a file the Hub
    does not list, a link, or a missing manifest is refused, naming it. No component of
    `source_dir` below `cache_root` (the cache's mount; default its parent) may be a link.

    With `landing_seconds` the model may still be landing on the cache (gang 0's nodes
    download it while their stages are copied: vllm-cluster-node prepare-serve
    --model-landing): the
    stage is planned from the manifest, and each file is copied as soon as it is on the
    cache with the manifest's size, hashed like every other; a file still missing after
    `landing_seconds` is refused, naming it.

    Returns {"mode": "local"|"cache", "reason", "unchanged", "files" (the stage's weight
    files), "stages", "layout", "stage_bytes", "total_weight_bytes", "bytes_copied",
    "bytes_kept", "seconds", "mb_per_s"}. `progress(text)` hears of a long copy at least
    every `progress_seconds`.
    """
    if instance_store:
        require_mounted(local_root, target_dir)
    source = Path(os.path.abspath(source_dir))
    landing = _Landing(source, time.monotonic() + landing_seconds, poll_seconds, progress or (lambda _text: None))
    source_fd = landing.until(lambda: _open_dir_nofollow(source, cache_root), "the model's directory")
    try:
        return _copy_stage(
            source,
            source_fd,
            Path(target_dir).absolute(),
            stages=stages,
            pp_size=pp_size,
            model=model,
            revision=revision,
            partition=partition,
            streams=streams,
            say=progress or (lambda _text: None),
            local_root=local_root,
            range_bytes=range_bytes,
            progress_seconds=progress_seconds,
            landing=landing if landing_seconds > 0 else None,
        )
    finally:
        os.close(source_fd)


class _Landing:
    """Waits for the files of a model that gang 0's nodes are still downloading into the
    cache's `source`: a file has landed once it is there with the manifest's size (hf
    download moves a file into place whole); its bytes are hashed when it is copied."""

    def __init__(self, source: Path, deadline: float, poll_seconds: float, say: Callable[[str], None]):
        self.source, self.deadline, self.poll_seconds, self.say = source, deadline, poll_seconds, say

    def _late(self, what: str) -> StageError:
        return StageError(
            f"{what} did not land on the cache in time: gang 0's nodes download the model (their stage-model "
            "commands, model and model-part-*): see why theirs failed, then run this command again"
        )

    def until(self, attempt: Callable[[], int], what: str) -> int:
        """attempt()'s result once it no longer raises FileNotFoundError, by the deadline."""
        while True:
            try:
                return attempt()
            except FileNotFoundError:
                if time.monotonic() >= self.deadline:
                    raise self._late(f"{self.source}: {what}") from None
                time.sleep(self.poll_seconds)

    def landed(self, source_fd: int, sizes: dict[str, int]) -> list[str]:
        """The names of `sizes` whose file is on the cache with its size now."""
        found = []
        for name in sorted(sizes):
            try:
                fd = _open_beneath(source_fd, name, shown=self.source / name)
            except FileNotFoundError:
                continue
            try:
                if os.fstat(fd).st_size == sizes[name]:
                    found.append(name)
            finally:
                os.close(fd)
        return found

    def all_of(self, source_fd: int, sizes: dict[str, int]) -> None:
        """Until every file of `sizes` has landed, by the deadline."""
        while missing := sorted(set(sizes) - set(self.landed(source_fd, sizes))):
            self.some_of(source_fd, {name: sizes[name] for name in missing})

    def some_of(self, source_fd: int, sizes: dict[str, int]) -> list[str]:
        """Until at least one file of `sizes` has landed, by the deadline: those that have."""
        last_said = time.monotonic()
        while not (found := self.landed(source_fd, sizes)):
            now = time.monotonic()
            if now >= self.deadline:
                first = sorted(sizes)[0]
                more = f" (and {len(sizes) - 1} more)" if len(sizes) > 1 else ""
                raise self._late(f"{self.source}/{first}{more}")
            if now - last_said >= PROGRESS_SECONDS:
                self.say(f"waiting for {len(sizes)} files of this node's stages to land on the cache")
                last_said = now
            time.sleep(self.poll_seconds)
        return found


def _copy_stage(
    source: Path,
    source_fd: int,
    target: Path,
    *,
    stages: Iterable[int],
    pp_size: int,
    model: str,
    revision: str,
    partition: str | None,
    streams: int,
    say: Callable[[str], None],
    local_root: str | os.PathLike | None,
    range_bytes: int,
    progress_seconds: float,
    landing: _Landing | None = None,
) -> dict:
    start = time.monotonic()
    if target == source or source in target.parents or target in source.parents or len(target.parts) < 3:
        raise StageError(f"--target {target} must be a directory of its own, away from the cache's {source}")
    if landing is not None:
        # Every part writes the manifest first, before its download.
        landing.until(lambda: os.close(_open_beneath(source_fd, MANIFEST_NAME)) or 0, MANIFEST_NAME)
    manifest = read_manifest(source_fd, source)
    hub_files = manifest["files"]
    listing = None
    if landing is not None:
        listing = {name: expect["size"] for name, expect in hub_files.items()}
        # What the plan reads: landed, and the Hub's bytes, before it is read.
        planned = [name for name in ("config.json", INDEX_NAME) if name in listing]
        landing.all_of(source_fd, {name: listing[name] for name in planned})
        problems = _check_at(source_fd, manifest, planned, workers=len(planned))
        if problems:
            raise StageError(
                f"{source}/{problems[0]}: the cache's copy is not the Hub's; remove it and run the model command again"
            )
    planted = [name for name in tree_files(source_fd, source) if name not in hub_files and name != MANIFEST_NAME]
    if planted:
        more = f" (and {len(planted) - 1} more)" if len(planted) > 1 else ""
        raise StageError(
            f"{source}/{planted[0]}{more} is not a file of {manifest.get('model')}@{manifest.get('revision')} as the "
            "Hub lists it: planted or left on the cache by something else; remove it and run the model command again"
        )
    # Every path below reaches the source through this descriptor's directory, whatever
    # its path on the cache points at meanwhile.
    pinned = Path(f"/proc/self/fd/{source_fd}")
    try:
        plan = stage_plan(pinned, stages, pp_size, partition, listing)
    except StageError as err:
        raise StageError(str(err).replace(str(pinned), str(source))) from err
    hub_digest = hashlib.sha256(json.dumps(hub_files, sort_keys=True).encode()).hexdigest()
    identity = {
        "model": model,
        "revision": revision,
        "source": str(source),
        "stages": plan["stages"],
        "pp_size": pp_size,
        "partition": partition,
        "layout": plan["layout"],
        "hub_files": hub_digest,
    }
    wanted = [*plan["weights"], *plan["others"]]
    unlisted = [name for name in wanted if name not in hub_files]
    if unlisted:  # appeared since tree_files looked: planted meanwhile
        raise StageError(
            f"{source}/{unlisted[0]} is not a file of {manifest.get('model')}@{manifest.get('revision')} as the Hub "
            "lists it: planted on the cache; remove it and run the model command again"
        )
    hashes = {name: hub_files[name] for name in wanted}
    summary = {
        "stages": plan["stages"],
        "files": plan["weights"],
        "layout": plan["layout"],
        "stage_bytes": plan["stage_bytes"],
        "total_weight_bytes": plan["total_weight_bytes"],
        "bytes_copied": 0,
        "bytes_kept": 0,
        "unchanged": False,
    }

    def done(mode: str, reason: str, **extra) -> dict:
        seconds = time.monotonic() - start
        rate = summary["bytes_copied"] / seconds / 1e6 if seconds > 0 else 0.0
        return {**summary, **extra, "mode": mode, "reason": reason, "seconds": round(seconds, 3), "mb_per_s": rate}

    if target.exists() and not target.is_dir():
        raise StageError(f"--target {target} exists and is not a directory: remove it or choose another")
    marker = _read_marker(target) if target.is_dir() else None
    if target.is_dir() and marker is None and any(target.iterdir()):
        raise StageError(
            f"{target} holds files but no {MARKER_NAME}: it is not a copy of this tool's; "
            "empty it or choose another --target"
        )
    same_identity = marker is not None and all(marker.get(key) == value for key, value in identity.items())
    same_revision = marker is not None and all(
        marker.get(key) == identity[key] for key in ("model", "revision", "source")
    )

    no_root = local_root is not None and not Path(local_root).is_dir()
    # Whole files of the same revision are kept; everything else is copied.
    kept = set()
    if same_revision and not no_root:
        for name in wanted:
            path = target / name
            if path.is_symlink() or not path.is_file() or path.stat().st_size != plan["sizes"][name]:
                continue
            if name in plan["tensors"] and check_weight_file(path, plan["tensors"][name]):
                continue
            # Hashed when it was copied: kept only while the Hub's hash is still the one it had.
            if marker.get("hashes", {}).get(name) != hashes[name]:
                continue
            kept.add(name)
    if (
        same_identity
        and marker.get("state") == "complete"
        and marker.get("mode") == "local"
        and kept == set(wanted)
        and all(marker.get("files", {}).get(name) == plan["sizes"][name] for name in wanted)
    ):
        summary["bytes_kept"] = sum(plan["sizes"][name] for name in wanted)
        return done(
            "local", "the local copy is complete (same model, revision and stages): nothing copied", unchanged=True
        )

    needed = sum(plan["sizes"][name] for name in wanted if name not in kept)
    free = shutil.disk_usage(_existing_ancestor(target)).free
    freed = 0
    if target.is_dir():
        freed = sum(
            path.stat().st_size
            for path in _entries(target)
            if not path.is_symlink() and path.relative_to(target).as_posix() not in kept
        )
    if no_root:
        mode, reason = "cache", f"{local_root} does not exist (no local disk): serving from the cache through links"
    elif free + freed < needed * (1 + FREE_MARGIN):
        mode = "cache"
        reason = (
            f"{_existing_ancestor(target)} has {(free + freed) / 1e9:.1f} GB free, "
            f"the stage needs {needed / 1e9:.1f} GB + {FREE_MARGIN:.0%}: serving from the cache through links"
        )
    else:
        mode, reason = "local", f"copied this node's stages {plan['stages']} ({plan['layout_reason']})"

    if mode == "cache" and landing is not None:
        landing.all_of(source_fd, {name: plan["sizes"][name] for name in wanted})
    if mode == "cache":
        # vLLM will read the cache's own files: hash them there (a read over the network of
        # the stage's bytes, every time, as they may have changed since the last run).
        problems = _check_at(source_fd, manifest, wanted, workers=streams)
        if problems:
            raise StageError(
                f"{source}/{problems[0]}{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}: the "
                "cache's copy is not the Hub's; remove it and the model's completion marker "
                "(complete/<model>/<revision> on the cache) and run the model command again"
            )
    if mode == "cache" and same_identity and marker.get("state") == "complete" and marker.get("mode") == "cache":
        links_ok = all(
            (target / name).is_symlink() and os.readlink(target / name) == str(source / name) for name in wanted
        )
        if links_ok:
            return done("cache", reason + "; the links are in place: nothing changed", unchanged=True)

    # From here on the target is being changed: a marker that matches nothing comes first.
    target.mkdir(parents=True, exist_ok=True)
    _write_json(target / MARKER_NAME, {**identity, "state": "copying", "mode": mode})
    keep_paths = {MARKER_NAME} | (kept if mode == "local" else set())
    for path in _entries(target):
        if path.relative_to(target).as_posix() not in keep_paths:
            path.unlink()
    _remove_empty_dirs(target)

    if mode == "cache":
        for name in wanted:
            link = target / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source / name)
    else:
        jobs = [
            {
                "name": name,
                "source": pinned / name,
                "shown": source / name,
                "expect": hashes[name],
                "final": target / name,
                "partial": target / (name + PARTIAL_SUFFIX),
                "size": plan["sizes"][name],
                "safetensors": name.endswith(".safetensors"),
                "tensors": plan["tensors"].get(name, set()),
            }
            for name in wanted
            if name not in kept
        ]
        copy_bytes = sum(job["size"] for job in jobs)
        say(
            f"copying {len(jobs)} files ({copy_bytes / 1e6:.0f} MB) of stages {plan['stages']} "
            f"from {source} to {target} with {streams} streams; keeping {len(kept)} files already there"
            + ("; each as soon as it lands on the cache" if landing is not None else "")
        )
        waiting = {job["name"]: job for job in jobs}
        try:
            # While the model lands, in rounds: every file there now, then those that came meanwhile.
            while waiting:
                if landing is None:
                    ready = [waiting.pop(name) for name in sorted(waiting)]
                else:
                    sizes = {name: job["size"] for name, job in waiting.items()}
                    ready = [waiting.pop(name) for name in landing.some_of(source_fd, sizes)]
                for job in ready:
                    if job["safetensors"]:
                        problem = check_weight_file(job["source"], job["tensors"])
                        problem = problem and problem.replace(str(pinned), str(source))
                        if problem:
                            raise StageError(
                                f"{source}/{problem}: the cache's copy is broken; remove the file and the model's "
                                "completion marker (complete/<model>/<revision> on the cache) and run the model "
                                "command again"
                            )
                for job in ready:
                    job["source_fd"] = _open_beneath(source_fd, job["name"], shown=job["shown"])
                _Copier(streams, range_bytes, say, progress_seconds).run(ready)
        finally:
            for job in jobs:
                if "source_fd" in job:
                    os.close(job["source_fd"])
        summary["bytes_copied"] = copy_bytes
        summary["bytes_kept"] = sum(plan["sizes"][name] for name in kept)
    files = {name: plan["sizes"][name] for name in wanted}
    if plan["index"] is not None:
        files[INDEX_NAME] = _write_json(target / INDEX_NAME, plan["index"])
    for directory in {(target / name).parent for name in files}:
        _fsync_dir(directory)
    _write_json(target / MARKER_NAME, {**identity, "state": "complete", "mode": mode, "files": files, "hashes": hashes})
    _fsync_dir(target)
    result = done(mode, reason)
    if mode == "local":
        say(
            f"copied {result['bytes_copied'] / 1e6:.0f} MB in {result['seconds']:.1f} s "
            f"({result['mb_per_s']:.0f} MB/s), kept {result['bytes_kept'] / 1e6:.0f} MB"
        )
    return result

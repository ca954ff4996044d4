"""vLLM's warm-up kept on the shared cache (scripts/lib/engine_cache.py, scripts/node/engine-cache):
the key changes with what changes the compiled graphs and with nothing else; seed and publish
move whole pieces only, never overwrite one, never leave or take a temporary, never follow a link."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.lib import engine_cache

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "scripts" / "node" / "engine-cache"

# The layout vLLM 0.32.0's CPU build wrote under VLLM_CACHE_ROOT for the tiny model (one
# rank), as seen on this machine; the P2P file and a Triton kernel directory are the GPU
# build's (all_reduce_utils.py:367, triton/runtime/cache.py).
AOT = "torch_compile_cache/torch_aot_compile/eecb246d117d4546d4b3e3407f996ff1300cc86d8638463bd282eb31bbb796f5"
LAYOUT = {
    f"{AOT}/rank_0_0/model": b"aot artifact rank 0" * 50,
    f"{AOT}/rank_1_0/model": b"aot artifact rank 1" * 50,
    f"{AOT}/inductor_cache/24/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.cpp": b"// kernel",
    f"{AOT}/inductor_cache/24/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.so": b"\x7fELF kernel",
    f"{AOT}/inductor_cache/aotautograd/ay6cjwohoqfq/cr2nrwizsfda": b"aotautograd entry",
    "modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json": b'{"hash": "d03"}',
    "gpu_p2p_access_cache_for_0,1,2,3,4,5,6,7.json": b'{"0->1": true}',
    "triton/KXQ2RHB/__grp__matmul.json": b'{"child_paths": {}}',
    "triton/KXQ2RHB/matmul.cubin": b"cubin",
}
# The pieces of LAYOUT: a rank's and a Triton kernel's directories whole, every other file alone.
LAYOUT_PIECES = sorted(
    [
        f"{AOT}/rank_0_0",
        f"{AOT}/rank_1_0",
        f"{AOT}/inductor_cache/24/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.cpp",
        f"{AOT}/inductor_cache/24/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.so",
        f"{AOT}/inductor_cache/aotautograd/ay6cjwohoqfq/cr2nrwizsfda",
        "modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json",
        "gpu_p2p_access_cache_for_0,1,2,3,4,5,6,7.json",
        "triton/KXQ2RHB",
    ]
)
# What no cache holds as a piece: Inductor's locks, vLLM's, Inductor's and Triton's temporaries.
NOT_PIECES = {
    f"{AOT}/inductor_cache/locks/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.lock": b"",
    f"{AOT}/rank_2_0/model.4242.tmp": b"half an artifact",
    f"{AOT}/inductor_cache/24/.4242.139.tmp": b"half a kernel",
    "triton/tmp.pid_4242_abcdef/matmul.cubin": b"half a cubin",
}


def make_tree(root: Path, files: dict[str, bytes]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if relative.endswith(".so"):
            path.chmod(0o755)


def files_under(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def temporaries_under(root: Path) -> list[str]:
    return [path.as_posix() for path in root.rglob(f"{engine_cache.TEMP_PREFIX}*")]


# --- the key ----------------------------------------------------------------------------

# The serve arguments the stack writes (components/bootstrap.py vllm_serve_args), for one head.
BASE = dict(
    vllm_version="0.33.0",
    model="meta-llama/Llama-3.1-70B-Instruct",
    revision="1605565b47bb9346c5515c34102e054115b4f98b",
    tensor_parallel=8,
    pipeline_parallel=2,
    max_model_len=8192,
)


def serve_args(
    head_ip: str = "10.0.1.10",
    port: str = "8000",
    served: str = "llama",
    model_dir: str = "/mnt/vllm-models/hub/meta-llama--Llama-3.1-70B-Instruct/1605565b",
    extra: tuple[str, ...] = (),
) -> list[str]:
    return [
        model_dir,
        "--served-model-name",
        served,
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "2",
        "--distributed-executor-backend",
        "ray",
        "--host",
        head_ip,
        "--port",
        port,
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
        *extra,
    ]


def key(serve: list[str] | None = None, hardware: str = "p5.48xlarge", **changes: object) -> str:
    inputs = {**BASE, **changes}
    if serve is None:
        serve = serve_args()
        for option, name in (
            ("--tensor-parallel-size", "tensor_parallel"),
            ("--pipeline-parallel-size", "pipeline_parallel"),
            ("--max-model-len", "max_model_len"),
        ):
            index = serve.index(option)
            if inputs[name] is None:
                del serve[index : index + 2]
            else:
                serve[index + 1] = str(inputs[name])
    return engine_cache.warmup_key(**inputs, serve_args=serve, hardware=hardware)


def test_the_key_is_short_hex_and_the_same_every_time():
    first = key()
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert key() == first
    # A fresh interpreter computes the same key (no hash randomisation, no dict order).
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from scripts.lib import engine_cache as e; "
        "print(e.warmup_key('0.33.0', 'meta-llama/Llama-3.1-70B-Instruct', '1605565b47bb9346c5515c34102e054115b4f98b', "
        "8, 2, 8192, sys.argv[2:], hardware='p5.48xlarge'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), *serve_args()], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == first


@pytest.mark.parametrize(
    "change",
    [
        {"vllm_version": "0.33.1"},
        {"model": "meta-llama/Llama-3.1-8B-Instruct"},
        {"revision": "0e9e39f249a16976918f6564b8830bc894c89659"},
        {"tensor_parallel": 4},
        {"pipeline_parallel": 3},
        {"max_model_len": 4096},
        {"max_model_len": None},
        {"hardware": "g6e.48xlarge"},
    ],
    ids=lambda change: "-".join(f"{k}={v}" for k, v in change.items()),
)
def test_every_input_that_changes_the_compiled_graphs_changes_the_key(change):
    change = dict(change)
    hardware = change.pop("hardware", "p5.48xlarge")
    assert key(hardware=hardware, **change) != key()


@pytest.mark.parametrize(
    "extra",
    [
        ("--dtype", "float16"),
        ("--quantization", "fp8"),
        ("-q", "fp8"),
        ("--kv-cache-dtype", "fp8"),
        ("--max-num-seqs", "64"),
        ("--max-num-batched-tokens", "16384"),
        ("--enforce-eager",),
        ("--compilation-config", '{"mode": 3, "cudagraph_capture_sizes": [1, 2, 4]}'),
        ("--enable-expert-parallel",),
        ("--trust-remote-code",),
        ("--an-option-of-a-later-vllm", "1"),  # unknown arguments are kept: at worst a compile
    ],
)
def test_serve_arguments_that_change_the_graph_change_the_key(extra):
    assert key(serve_args(extra=extra)) != key()


@pytest.mark.parametrize(
    "other",
    [
        serve_args(head_ip="10.0.1.77"),
        serve_args(port="8001"),
        serve_args(served="gang-1-name"),
        serve_args(model_dir="/opt/dlami/nvme/vllm-cluster/models/meta-llama--Llama-3.1-70B-Instruct/1605565b"),
        serve_args(extra=("--api-key", "sk-secret")),
        serve_args(extra=("--enable-prefix-caching", "--disable-log-stats", "--uvicorn-log-level", "warning")),
        serve_args(extra=("--safetensors-load-strategy", "eager", "--seed", "7")),
        [arg.replace("0.9", "0.95") for arg in serve_args()],  # --gpu-memory-utilization
        [arg.replace("ray", "mp") for arg in serve_args()],  # --distributed-executor-backend
    ],
    ids=["host", "port", "served-name", "model-path", "api-key", "logging", "load-strategy-seed", "memory", "backend"],
)
def test_what_does_not_change_the_graph_does_not_change_the_key(other):
    assert key(other) == key()


def test_spelling_and_order_of_the_serve_arguments_do_not_change_the_key():
    base = serve_args(extra=("--max-num-seqs", "64", "--dtype", "bfloat16"))
    reordered = serve_args(extra=("--dtype", "bfloat16", "--max-num-seqs", "64"))
    spelled = serve_args(extra=("--max_num_seqs=64", "--dtype=bfloat16"))
    short = [{"--tensor-parallel-size": "-tp", "--pipeline-parallel-size": "-pp"}.get(arg, arg) for arg in base]
    assert key(reordered) == key(base)
    assert key(spelled) == key(base)
    assert key(short) == key(base)
    assert key(base) != key()


def test_a_serve_argument_that_disagrees_with_an_explicit_input_is_refused():
    with pytest.raises(ValueError, match="--tensor-parallel-size 8 disagrees with tensor_parallel=4"):
        engine_cache.warmup_key(**{**BASE, "tensor_parallel": 4}, serve_args=serve_args(), hardware="p5.48xlarge")
    with pytest.raises(ValueError, match="--max-model-len"):
        engine_cache.warmup_key(**{**BASE, "max_model_len": None}, serve_args=serve_args(), hardware="p5.48xlarge")


def test_graph_arguments_keep_what_vllm_hashes_and_drop_the_rest():
    kept = engine_cache.graph_arguments(serve_args(extra=("--dtype", "float16", "--api-key", "k", "--enforce-eager")))
    assert kept == [("--dtype", ("float16",)), ("--enforce-eager", ())]


# --- seed and publish ---------------------------------------------------------------------


def test_scan_finds_whole_pieces_and_nothing_half_written(tmp_path):
    make_tree(tmp_path, {**LAYOUT, **NOT_PIECES})
    found = engine_cache.scan(tmp_path)
    assert found.pieces == LAYOUT_PIECES
    assert found.symlinks == []


def test_publish_then_seed_carries_every_piece_and_only_pieces(tmp_path):
    node_a, shared, node_b = tmp_path / "node-a", tmp_path / "share" / "warmup" / "k", tmp_path / "node-b"
    make_tree(node_a, {**LAYOUT, **NOT_PIECES})

    published = engine_cache.publish(node_a, shared)
    assert (published.found, published.copied, published.present) == (len(LAYOUT_PIECES), len(LAYOUT_PIECES), 0)
    assert published.copied_bytes == sum(len(content) for content in LAYOUT.values())
    assert files_under(shared) == LAYOUT

    seeded = engine_cache.seed(shared, node_b)
    assert (seeded.copied, seeded.present) == (len(LAYOUT_PIECES), 0)
    assert files_under(node_b) == LAYOUT
    assert stat.S_IMODE(node_b.stat().st_mode) == 0o700  # a new local root is root-only

    # The share's modes are the model tree's; an executable stays executable.
    for path in shared.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o755, path
        else:
            assert mode == (0o755 if path.suffix == ".so" else 0o644), path

    again = engine_cache.publish(node_a, shared)
    assert (again.copied, again.present, again.copied_bytes) == (0, len(LAYOUT_PIECES), 0)
    assert engine_cache.seed(shared, node_b).copied == 0
    assert temporaries_under(tmp_path) == []


def test_publish_under_the_node_scripts_umask_leaves_the_warmup_root_open_to_read(tmp_path):
    """vllm-cluster-node runs with umask 077 (its secrets); the warm-up root it creates on
    the model cache must still be 0755 like the model tree, not a 0700 that hides every
    key below it from all but root."""
    model_root = tmp_path / "mnt-vllm-models"
    model_root.mkdir(mode=0o755)
    node = tmp_path / "node"
    make_tree(node, LAYOUT)
    old = os.umask(0o077)
    try:
        engine_cache.publish(node, model_root / "warmup" / "k")
    finally:
        os.umask(old)
    for directory in (model_root / "warmup", model_root / "warmup" / "k"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory


def test_a_piece_on_the_share_is_never_overwritten(tmp_path):
    node_a, node_b, shared = tmp_path / "a", tmp_path / "b", tmp_path / "share"
    make_tree(node_a, LAYOUT)
    make_tree(node_b, {relative: content + b" from b" for relative, content in LAYOUT.items()})
    engine_cache.publish(node_a, shared)
    second = engine_cache.publish(node_b, shared)
    assert (second.copied, second.present) == (0, len(LAYOUT_PIECES))
    assert files_under(shared) == LAYOUT


def test_seed_keeps_what_the_node_has(tmp_path):
    shared, local = tmp_path / "share", tmp_path / "local"
    make_tree(shared, LAYOUT)
    mine = {f"{AOT}/rank_0_0/model": b"this node's own artifact"}
    make_tree(local, mine)
    seeded = engine_cache.seed(shared, local)
    assert (seeded.copied, seeded.present) == (len(LAYOUT_PIECES) - 1, 1)
    assert files_under(local) == {**LAYOUT, **mine}


def test_nothing_on_the_share_yet_is_no_error(tmp_path):
    seeded = engine_cache.seed(tmp_path / "share" / "warmup" / "new-key", tmp_path / "local")
    assert (seeded.found, seeded.copied) == (0, 0)
    assert (tmp_path / "local").is_dir()


def test_publish_without_a_local_cache_names_it_and_the_fix(tmp_path):
    with pytest.raises(engine_cache.EngineCacheError, match=r"local cache .*/missing does not exist.*VLLM_CACHE_ROOT"):
        engine_cache.publish(tmp_path / "missing", tmp_path / "share")


def test_a_partly_written_temporary_on_the_share_is_never_seeded(tmp_path):
    shared, local = tmp_path / "share", tmp_path / "local"
    make_tree(shared, LAYOUT)
    partial = {
        # A node died while copying a file piece and a rank's directory to the share.
        f"{AOT}/inductor_cache/24/{engine_cache.TEMP_PREFIX}node-b.77.0a1b2c3d.cx.so": b"\x7fEL",
        f"{AOT}/{engine_cache.TEMP_PREFIX}node-b.77.9f8e7d6c.rank_3_0/model": b"half",
        **NOT_PIECES,
    }
    make_tree(shared, partial)
    seeded = engine_cache.seed(shared, local)
    assert seeded.copied == len(LAYOUT_PIECES)
    assert files_under(local) == LAYOUT


def test_publish_removes_stale_temporaries_and_keeps_young_ones(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "share"
    make_tree(local, LAYOUT)
    stale = shared / f"{engine_cache.TEMP_PREFIX}node-c.12.aaaaaaaa.gpu_p2p_access_cache_for_0,1.json"
    young = shared / AOT / f"{engine_cache.TEMP_PREFIX}node-d.13.bbbbbbbb.rank_5_0"
    make_tree(
        shared, {stale.relative_to(shared).as_posix(): b"{", f"{young.relative_to(shared).as_posix()}/model": b"ab"}
    )
    old = time.time() - engine_cache.STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    published = engine_cache.publish(local, shared)
    assert published.stale_temps_removed == 1
    assert not stale.exists()
    assert (young / "model").read_bytes() == b"ab"  # another node's copy in progress


def test_a_temporary_another_node_puts_in_place_while_we_look_at_it_is_left_to_it(tmp_path, monkeypatch):
    """Publishing ends with a sweep for stale temporaries, while another node may still be
    publishing: a temporary listed by the sweep may be renamed into place (or removed) by
    its node before the sweep looks at its age. It is that node's, done: the sweep goes on
    (a race two nodes at once met under load, test_two_nodes_publishing_... below)."""
    shared = tmp_path / "share"
    temporary = shared / AOT / f"{engine_cache.TEMP_PREFIX}node-b.77.9f8e7d6c.rank_3_0"
    stale = shared / f"{engine_cache.TEMP_PREFIX}node-c.12.aaaaaaaa.gpu_p2p_access_cache_for_0,1.json"
    make_tree(shared, {f"{temporary.relative_to(shared).as_posix()}/model": b"ab", stale.name: b"{"})
    old = time.time() - engine_cache.STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    real_newest = engine_cache._newest_mtime

    def other_node_renames_it_first(dir_fd, name):
        if name == temporary.name:
            os.rename(temporary, temporary.with_name("rank_3_0"))  # the other node puts it in place
        return real_newest(dir_fd, name)

    monkeypatch.setattr(engine_cache, "_newest_mtime", other_node_renames_it_first)
    assert engine_cache.remove_stale_temps(shared) == 1
    assert not stale.exists() and (shared / AOT / "rank_3_0" / "model").read_bytes() == b"ab"


def test_links_are_never_followed_nor_copied(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("root's secret")
    shared, local = tmp_path / "share", tmp_path / "local"
    make_tree(shared, LAYOUT)
    (shared / "modelinfos" / "evil.json").symlink_to(outside / "secret")
    (shared / AOT / "rank_0_0" / "escape").symlink_to(outside)
    seeded = engine_cache.seed(shared, local)
    assert seeded.symlinks == 1
    assert files_under(local) == LAYOUT
    assert not any(path.is_symlink() for path in local.rglob("*"))

    # A link planted on the share where a directory belongs is refused, not written through.
    node = tmp_path / "node"
    make_tree(node, LAYOUT)
    target = tmp_path / "share2"
    target.mkdir()
    (target / "torch_compile_cache").symlink_to(outside)
    with pytest.raises(engine_cache.EngineCacheError, match=r"share2/torch_compile_cache is not a directory"):
        engine_cache.publish(node, target)
    assert sorted(path.name for path in outside.iterdir()) == ["secret"]


def test_a_temporary_swapped_for_a_link_on_the_share_is_not_followed(tmp_path, monkeypatch):
    """Another node sees our temporary directory appear on the share and puts a link to /etc
    (here: a directory of root's) in its place before we set its mode and fill it: the
    walk opens each component without following a link and sets modes through the
    descriptor (fchmod), so the link's target keeps its mode and gets no file."""
    outside = tmp_path / "etc"
    outside.mkdir(mode=0o700)
    outside.chmod(0o700)
    (outside / "shadow").write_text("root's secret")
    local, shared = tmp_path / "local", tmp_path / "share"
    make_tree(local, {f"{AOT}/rank_0_0/model": b"ours"})
    real_mkdir = os.mkdir

    def another_node_swaps_it(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        if os.path.basename(path).startswith(engine_cache.TEMP_PREFIX):
            os.rmdir(path, dir_fd=dir_fd)
            os.symlink(outside, path, dir_fd=dir_fd)

    monkeypatch.setattr(engine_cache.os, "mkdir", another_node_swaps_it)
    with pytest.raises(engine_cache.EngineCacheError, match="link"):
        engine_cache.publish(local, shared)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700
    assert sorted(path.name for path in outside.iterdir()) == ["shadow"]


def test_a_directory_swapped_for_a_link_on_the_share_after_the_scan_is_not_followed(tmp_path, monkeypatch):
    """Between the scan of the share and the copy of its pieces, another node replaces a
    directory above some pieces by a link to root's files: seed copies none of them, and
    the pieces elsewhere still."""
    outside = tmp_path / "etc"
    (outside / "rank_0_0").mkdir(parents=True)
    (outside / "rank_0_0" / "model").write_text("root's secret")
    shared, local = tmp_path / "share", tmp_path / "local"
    make_tree(shared, LAYOUT)
    real_scan = engine_cache.scan

    def then_swapped(root):
        found = real_scan(root)
        if root == shared:
            shutil.rmtree(shared / AOT)
            (shared / AOT).symlink_to(outside)
        return found

    monkeypatch.setattr(engine_cache, "scan", then_swapped)
    seeded = engine_cache.seed(shared, local)
    assert not any(b"root's secret" in content for content in files_under(local).values())
    assert not any(relative.startswith(AOT) for relative in files_under(local))
    assert seeded.symlinks == 5  # the five pieces under the link, counted as links met
    assert files_under(local)["triton/KXQ2RHB/matmul.cubin"] == LAYOUT["triton/KXQ2RHB/matmul.cubin"]


def test_the_shared_root_swapped_for_a_link_is_not_followed(tmp_path):
    outside = tmp_path / "etc"
    outside.mkdir(mode=0o700)
    outside.chmod(0o700)
    local = tmp_path / "local"
    make_tree(local, LAYOUT)
    (tmp_path / "warmup").symlink_to(outside)
    with pytest.raises(engine_cache.EngineCacheError, match="link"):
        engine_cache.publish(local, tmp_path / "warmup" / "key")
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700 and list(outside.iterdir()) == []


# --- two nodes at once ---------------------------------------------------------------------

BIG = 4 << 20  # large enough that two copies overlap


def _publish_when_ready(local: str, shared: str, barrier, results) -> None:
    barrier.wait()
    done = engine_cache.publish(Path(local), Path(shared))
    results.put((done.copied, done.present))


def test_two_nodes_publishing_the_same_pieces_at_once_leave_one_whole_piece_each(tmp_path):
    nodes = {}
    for name in ("a", "b"):
        content = {
            f"{AOT}/rank_0_0/model": name.encode() * BIG,
            f"{AOT}/rank_0_0/cache_key_factors.json": name.encode() * 100,
            f"{AOT}/inductor_cache/aotautograd/ay6c/cr2n": name.encode() * BIG,
            "gpu_p2p_access_cache_for_0,1.json": name.encode() * 10,
        }
        make_tree(tmp_path / name, content)
        nodes[name] = content
    context = multiprocessing.get_context("fork")
    for round_ in range(3):
        shared = tmp_path / f"share-{round_}"
        barrier, results = context.Barrier(2), context.Queue()
        workers = [
            context.Process(target=_publish_when_ready, args=(str(tmp_path / name), str(shared), barrier, results))
            for name in nodes
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        outcomes = [results.get(timeout=5) for _ in workers]
        # Every piece was put in place by exactly one node; the other found it there.
        assert sum(copied for copied, _ in outcomes) == 3
        assert sum(present for _, present in outcomes) == 3
        on_share = files_under(shared)
        assert set(on_share) == set(nodes["a"])
        for relative, content in on_share.items():
            assert content in (nodes["a"][relative], nodes["b"][relative]), relative  # whole, never mixed
        # A directory piece is one node's, all of it.
        rank = [on_share[f"{AOT}/rank_0_0/{name}"][:1] for name in ("model", "cache_key_factors.json")]
        assert rank[0] == rank[1]
        assert temporaries_under(shared) == []


def test_the_loser_of_a_race_keeps_the_winners_piece_and_leaves_no_temporary(tmp_path, monkeypatch):
    """Another node puts the piece in place between our check and our link (or rename)."""
    local, shared = tmp_path / "local", tmp_path / "share"
    make_tree(local, {"gpu_p2p_access_cache_for_0,1.json": b"ours", f"{AOT}/rank_0_0/model": b"ours"})
    real_link, real_rename = os.link, os.rename

    # The pieces are put in place relative to their directory's descriptor (dst_dir_fd).
    def link_after_the_other_node(source, target, **where):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=where["dst_dir_fd"])
        os.write(fd, b"theirs")
        os.close(fd)
        return real_link(source, target, **where)

    def rename_after_the_other_node(source, target, **where):
        if Path(target).name.startswith("rank_"):
            os.mkdir(target, dir_fd=where["dst_dir_fd"])
            theirs = os.open(target, os.O_RDONLY | os.O_DIRECTORY, dir_fd=where["dst_dir_fd"])
            fd = os.open("model", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=theirs)
            os.write(fd, b"theirs")
            os.close(fd)
            os.close(theirs)
        return real_rename(source, target, **where)

    monkeypatch.setattr(engine_cache.os, "link", link_after_the_other_node)
    monkeypatch.setattr(engine_cache.os, "rename", rename_after_the_other_node)
    published = engine_cache.publish(local, shared)
    assert (published.copied, published.present) == (0, 2)
    assert files_under(shared) == {"gpu_p2p_access_cache_for_0,1.json": b"theirs", f"{AOT}/rank_0_0/model": b"theirs"}
    assert temporaries_under(shared) == []


def test_an_error_other_than_a_lost_race_is_raised(tmp_path, monkeypatch):
    local, shared = tmp_path / "local", tmp_path / "share"
    make_tree(local, {"modelinfos/x.json": b"{}"})

    def no_space(source, target, **_where):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(engine_cache.os, "link", no_space)
    with pytest.raises(OSError, match="No space left"):
        engine_cache.publish(local, shared)
    assert temporaries_under(shared) == []


# --- the command line, as installed ------------------------------------------------------


@pytest.fixture
def installed(tmp_path):
    """scripts/node/engine-cache and its library in the nodes' layout (/opt/vllm-cluster/bin, lib)."""
    (tmp_path / "opt" / "bin").mkdir(parents=True)
    (tmp_path / "opt" / "lib").mkdir()
    shutil.copy2(CLI, tmp_path / "opt" / "bin" / "engine-cache")
    shutil.copy2(ROOT / "scripts" / "lib" / "engine_cache.py", tmp_path / "opt" / "lib" / "engine_cache.py")
    return tmp_path / "opt" / "bin" / "engine-cache"


def run(cli: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(cli), *args], capture_output=True, text=True, timeout=60)


def test_the_command_seeds_and_publishes_with_one_line_each(installed, tmp_path):
    node_a, shared, node_b = tmp_path / "a", tmp_path / "share" / "warmup" / "k", tmp_path / "b"
    make_tree(node_a, LAYOUT)
    size = sum(len(content) for content in LAYOUT.values())

    first = run(installed, "publish", "--local", str(node_a), "--shared", str(shared))
    assert first.returncode == 0, first.stderr
    assert first.stdout == (
        f"published 8 of 8 pieces ({size / 1e6:.1f} MB) from {node_a} to {shared}; 0 already there (kept)\n"
    )
    seeded = run(installed, "seed", "--shared", str(shared), "--local", str(node_b))
    assert seeded.returncode == 0, seeded.stderr
    assert seeded.stdout.startswith(f"seeded 8 of 8 pieces ({size / 1e6:.1f} MB) from {shared} into {node_b};")
    assert files_under(node_b) == LAYOUT
    again = run(installed, "publish", "--local", str(node_b), "--shared", str(shared))
    assert "published 0 of 8 pieces (0.0 MB)" in again.stdout and "8 already there (kept)" in again.stdout

    empty = run(installed, "seed", "--shared", str(tmp_path / "share" / "warmup" / "other"), "--local", str(node_b))
    assert empty.returncode == 0 and empty.stdout.startswith("no pieces at ")


def test_the_command_names_the_path_and_the_fix_on_error(installed, tmp_path):
    missing = run(installed, "publish", "--local", str(tmp_path / "nowhere"), "--shared", str(tmp_path / "s"))
    assert missing.returncode == 1
    assert f"{tmp_path / 'nowhere'} does not exist" in missing.stderr and "VLLM_CACHE_ROOT" in missing.stderr
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "x.json").write_text("{}")
    # A share that cannot be written (even root cannot make a directory in /proc).
    failed = run(installed, "publish", "--local", str(tmp_path / "local"), "--shared", "/proc/engine-cache-test/k")
    assert failed.returncode == 1
    assert "/proc/engine-cache-test" in failed.stderr and "mounted read-write" in failed.stderr
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    refused = run(installed, "publish", "--local", str(tmp_path / "local"), "--shared", str(not_a_dir / "k"))
    assert refused.returncode == 1 and f"{not_a_dir} is not a directory" in refused.stderr


def test_the_command_prints_the_key_the_program_computes(installed):
    args = serve_args(extra=("--dtype", "bfloat16"))
    out = run(
        installed,
        "key",
        "--vllm-version",
        BASE["vllm_version"],
        "--model",
        BASE["model"],
        "--revision",
        BASE["revision"],
        "--tp",
        "8",
        "--pp",
        "2",
        "--max-model-len",
        "8192",
        "--hardware",
        "p5.48xlarge",
        "--serve-args",
        " ".join(args),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == key(args)
    wrong = run(
        installed,
        "key",
        "--vllm-version",
        "0.33.0",
        "--model",
        "m",
        "--revision",
        "r",
        "--tp",
        "4",
        "--pp",
        "1",
        "--serve-args",
        "m -tp 8",
    )
    assert wrong.returncode == 1 and "disagrees with tensor_parallel=4" in wrong.stderr

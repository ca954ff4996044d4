"""The Hub's test double (tests/doubles/fake_hf_hub.py) and the tiny model's builder
(tests/tiny_model.py), without a fleet.

The double is what the fleet's nodes download the model from, so it must answer as
the Hub answers huggingface_hub 2.4.0 (components/versions.py HF_HUB_VERSION): the
HTTP tests check its answers field by field, and where a Python with that
huggingface_hub is on this machine (this one, or the fleet's cached virtualenv) the
real client and `hf download` run against it. The builder's tests check the layout
the pipeline stages' file sets rest on, and build the model where torch is."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny_model
from doubles import fake_hf_hub

from components import versions
from localhosts.fleet import CACHE_DIR

REPO = "vllm-cluster-tests/tiny"
CONFIG = b'{"architectures": ["LlamaForCausalLM"]}\n'
SHARD_1 = bytes(range(256)) * 40
SHARD_2 = b"\x01" * 3000
ORIGINAL = b"\0" * 5000
FILES = {
    "config.json": CONFIG,
    "model-00001-of-00002.safetensors": SHARD_1,
    "model-00002-of-00002.safetensors": SHARD_2,
    "original/consolidated.00.pth": ORIGINAL,
}


@contextlib.contextmanager
def serve_hub(tmp_path, **options):
    """The double on 127.0.0.1 (a free port), serving REPO, in this process: url, root and
    log; `options` go to make_handler (tree_page_size)."""
    root = tmp_path / "hub"
    for name, data in FILES.items():
        path = root / REPO / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    log = tmp_path / "downloads.jsonl"
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_hf_hub.make_handler(root, log, **options))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}", root=root, log=log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def hub(tmp_path):
    """The double on 127.0.0.1 (a free port), serving REPO, in this process."""
    with serve_hub(tmp_path) as served:
        yield served


def request(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    """status, headers, body; an HTTP error is an answer too."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers or {})) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def get_json(url: str):
    status, _, body = request(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the Hub's API, over HTTP ----------------------------------------------------------


def test_model_info_with_blobs_gives_each_file_its_size_and_lfs_info(hub):
    info = get_json(f"{hub.url}/api/models/{REPO}/revision/main?blobs=true")
    siblings = {s["rfilename"]: s for s in info["siblings"]}
    assert {name: s["size"] for name, s in siblings.items()} == {name: len(data) for name, data in FILES.items()}
    # Weights are in LFS (the Hub's .gitattributes): the sibling names the file's sha256,
    # and its blob id is the id of the LFS pointer, as git's.
    shard = siblings["model-00001-of-00002.safetensors"]
    pointer = fake_hf_hub.lfs_pointer(sha256(SHARD_1), len(SHARD_1))
    assert shard["lfs"] == {"size": len(SHARD_1), "sha256": sha256(SHARD_1), "pointerSize": len(pointer)}
    assert shard["blobId"] == git_blob_id(pointer)
    assert "lfs" not in siblings["config.json"]
    assert siblings["config.json"]["blobId"] == git_blob_id(CONFIG)
    # Without blobs (files_metadata=False) the Hub names the files only.
    plain = get_json(f"{hub.url}/api/models/{REPO}/revision/main")
    assert all(set(s) == {"rfilename"} for s in plain["siblings"])


def test_tree_lists_one_level_or_everything_below_with_sizes(hub):
    everything = get_json(f"{hub.url}/api/models/{REPO}/tree/main?recursive=true")
    files = {e["path"]: e["size"] for e in everything if e["type"] == "file"}
    assert files == {name: len(data) for name, data in FILES.items()}
    assert [e["path"] for e in everything if e["type"] == "directory"] == ["original"]
    shard = next(e for e in everything if e["path"] == "model-00002-of-00002.safetensors")
    assert shard["lfs"]["oid"] == sha256(SHARD_2) and shard["lfs"]["size"] == len(SHARD_2)

    top = get_json(f"{hub.url}/api/models/{REPO}/tree/main")
    assert sorted(e["path"] for e in top) == sorted(["original", *(n for n in FILES if "/" not in n)])
    below = get_json(f"{hub.url}/api/models/{REPO}/tree/main/original")
    assert [(e["path"], e["size"]) for e in below] == [("original/consolidated.00.pth", len(ORIGINAL))]


def test_a_tree_larger_than_a_page_comes_in_pages_linked_by_a_next_cursor(tmp_path):
    # The Hub pages a tree (1,000 entries, huggingface_hub 2.4.0 hf_api.py _list_repo_tree_pages)
    # and names the next page in a Link header (utils/_pagination.py _get_next_page): a
    # client that reads only the first page misses files.
    with serve_hub(tmp_path, tree_page_size=2) as served:
        url = f"{served.url}/api/models/{REPO}/tree/main?recursive=true"
        pages = []
        while url:
            status, headers, body = request(url)
            assert status == 200, body
            pages.append(json.loads(body))
            link = headers.get("Link", "")
            match = re.fullmatch(r'<([^>]+)>; rel="next"', link)
            assert match or not link, link
            url = match.group(1) if match else None
        everything = [entry for page in pages for entry in page]
        assert [len(page) for page in pages] == [2, 2, 1]
        assert {e["path"] for e in everything if e["type"] == "file"} == set(FILES)
        assert len({e["path"] for e in everything}) == len(everything)


def test_two_revisions_have_different_commits_and_the_same_files(hub):
    main = get_json(f"{hub.url}/api/models/{REPO}/revision/main")["sha"]
    other = get_json(f"{hub.url}/api/models/{REPO}/revision/second")["sha"]
    assert main != other
    assert main == fake_hf_hub.revision_commit(hub.root, REPO, "main")
    assert other == fake_hf_hub.revision_commit(hub.root, REPO, "second")
    assert get_json(f"{hub.url}/api/models/{REPO}")["sha"] == main  # no revision: main
    for revision, commit in (("main", main), ("second", other), (other, other)):
        status, headers, body = request(f"{hub.url}/{REPO}/resolve/{revision}/config.json")
        assert (status, headers["X-Repo-Commit"], body) == (200, commit, CONFIG)
    # A commit it never gave out is unknown, as on the Hub.
    status, headers, _ = request(f"{hub.url}/api/models/{REPO}/revision/{'0' * 40}")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")


def test_mains_commit_resolves_before_any_name_was_asked(hub):
    main = fake_hf_hub.revision_commit(hub.root, REPO, "main")
    assert get_json(f"{hub.url}/api/models/{REPO}/revision/{main}")["sha"] == main
    second = fake_hf_hub.revision_commit(hub.root, REPO, "second")
    status, _, _ = request(f"{hub.url}/api/models/{REPO}/revision/{second}")
    assert status == 404  # until the hub has resolved "second"
    assert get_json(f"{hub.url}/api/models/{REPO}/revision/second")["sha"] == second
    assert get_json(f"{hub.url}/api/models/{REPO}/revision/{second}")["sha"] == second


def test_new_files_give_a_revision_a_new_commit_and_retire_the_old_one(hub):
    before = get_json(f"{hub.url}/api/models/{REPO}/revision/main")["sha"]
    (hub.root / REPO / "config.json").write_bytes(CONFIG + b" ")
    after = get_json(f"{hub.url}/api/models/{REPO}/revision/main")["sha"]
    assert after != before
    status, headers, _ = request(f"{hub.url}/{REPO}/resolve/{before}/config.json", method="HEAD")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")


def test_resolve_sends_the_headers_the_client_checks(hub):
    status, headers, body = request(f"{hub.url}/{REPO}/resolve/main/model-00001-of-00002.safetensors", method="HEAD")
    assert status == 200 and body == b""
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{sha256(SHARD_1)}"'
    assert headers["Content-Length"] == headers["X-Linked-Size"] == str(len(SHARD_1))
    _, headers, _ = request(f"{hub.url}/{REPO}/resolve/main/config.json", method="HEAD")
    assert headers["ETag"] == f'"{git_blob_id(CONFIG)}"' and "X-Linked-Etag" not in headers
    # Resumption: from a byte on.
    status, headers, body = request(
        f"{hub.url}/{REPO}/resolve/main/model-00001-of-00002.safetensors", headers={"Range": "bytes=1000-"}
    )
    assert (status, body, headers["Content-Range"]) == (206, SHARD_1[1000:], f"bytes 1000-{len(SHARD_1) - 1}/10240")
    status, _, _ = request(f"{hub.url}/{REPO}/resolve/main/config.json", headers={"Range": f"bytes={len(CONFIG)}-"})
    assert status == 416
    status, headers, _ = request(f"{hub.url}/{REPO}/resolve/main/missing.json")
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (
        404,
        "EntryNotFound",
        fake_hf_hub.revision_commit(hub.root, REPO, "main"),
    )
    status, headers, _ = request(f"{hub.url}/api/models/nobody/nothing/revision/main")
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")


def test_download_counts_are_per_file_and_a_resumption_is_no_new_download(hub):
    shard = "model-00002-of-00002.safetensors"
    second = fake_hf_hub.revision_commit(hub.root, REPO, "second")
    request(f"{hub.url}/{REPO}/resolve/main/{shard}")
    request(f"{hub.url}/{REPO}/resolve/main/{shard}", headers={"Range": "bytes=10-"})
    request(f"{hub.url}/{REPO}/resolve/second/{shard}")
    request(f"{hub.url}/{REPO}/resolve/main/config.json")
    request(f"{hub.url}/{REPO}/resolve/main/config.json", method="HEAD")  # metadata, not a download
    assert fake_hf_hub.download_counts(hub.log) == {shard: 2, "config.json": 1}
    assert fake_hf_hub.download_counts(hub.log, REPO, commit=second) == {shard: 1}
    assert fake_hf_hub.download_counts(hub.log, "nobody/nothing") == {}
    resumed = [e for e in fake_hf_hub.read_log(hub.log) if e["start"]]
    assert [(e["file"], e["start"], e["bytes"], e["size"]) for e in resumed] == [(shard, 10, 2990, 3000)]


# --- the real client -------------------------------------------------------------------


@cache
def python_with(check: str) -> Path | None:
    """A Python on this machine that passes `check` (Python code): this one, or one of
    the fleet's cached virtualenvs (localhosts/fleet.py fleet_venv), which are never built here."""
    candidates = [Path(sys.executable), *sorted(CACHE_DIR.glob("venv-*/bin/python"))]
    for python in candidates:
        if python.parent.parent.joinpath(".complete").exists() or python == Path(sys.executable):
            if subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0:
                return python
    return None


HF_HUB_CHECK = f"import huggingface_hub, sys; sys.exit(huggingface_hub.__version__ != {versions.HF_HUB_VERSION!r})"


@pytest.fixture
def hf_python() -> Path:
    python = python_with(HF_HUB_CHECK)
    if python is None:
        pytest.skip(f"no Python with huggingface_hub=={versions.HF_HUB_VERSION} here (the fleet's virtualenv has it)")
    return python


def hf(hf_python: Path, hub, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(cwd / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    done = subprocess.run(
        [str(hf_python.parent / "hf"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def downloaded(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(directory).parts
    }


def test_hf_download_include_fetches_the_named_files_only_once(hf_python, hub, tmp_path):
    shard = "model-00002-of-00002.safetensors"
    local = tmp_path / "local"
    # One pattern per --include (`--include A B` makes B a file name and ignores A).
    args = (
        "download",
        REPO,
        "--revision",
        "main",
        "--local-dir",
        str(local),
        "--include",
        shard,
        "--include",
        "config.json",
    )
    hf(hf_python, hub, *args, cwd=tmp_path)
    assert downloaded(local) == {shard: SHARD_2, "config.json": CONFIG}
    hf(hf_python, hub, *args, cwd=tmp_path)  # complete: nothing is fetched again
    assert fake_hf_hub.download_counts(hub.log) == {shard: 1, "config.json": 1}


def test_hf_download_exclude_leaves_out_the_excluded_files(hf_python, hub, tmp_path):
    local = tmp_path / "local"
    hf(
        hf_python,
        hub,
        "download",
        REPO,
        "--revision",
        "second",
        "--local-dir",
        str(local),
        "--exclude",
        "original/*",
        cwd=tmp_path,
    )
    assert downloaded(local) == {name: data for name, data in FILES.items() if not name.startswith("original/")}
    second = fake_hf_hub.revision_commit(hub.root, REPO, "second")
    assert fake_hf_hub.download_counts(hub.log, REPO, commit=second) == dict.fromkeys(downloaded(local), 1)


CLIENT = """
import json, sys
from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile
api, repo = HfApi(endpoint=sys.argv[1]), sys.argv[2]
info = {}
for revision in ("main", "second"):
    model = api.model_info(repo, revision=revision, files_metadata=True)
    info[revision] = {
        "sha": model.sha,
        "sizes": {s.rfilename: s.size for s in model.siblings},
        "lfs": {s.rfilename: s.lfs.sha256 for s in model.siblings if s.lfs},
        "tree": {f.path: f.size for f in api.list_repo_tree(repo, recursive=True, revision=revision)
                 if isinstance(f, RepoFile)},
    }
print(json.dumps(info))
"""


def test_huggingface_hub_reads_sizes_lfs_and_commits(hf_python, hub):
    done = subprocess.run(
        [str(hf_python), "-c", CLIENT, hub.url, REPO], capture_output=True, text=True, timeout=60, check=True
    )
    info = json.loads(done.stdout)
    sizes = {name: len(data) for name, data in FILES.items()}
    for revision in ("main", "second"):
        assert info[revision]["sizes"] == info[revision]["tree"] == sizes
        assert info[revision]["lfs"] == {n: sha256(d) for n, d in FILES.items() if n.endswith((".safetensors", ".pth"))}
        assert info[revision]["sha"] == fake_hf_hub.revision_commit(hub.root, REPO, revision)
    assert info["main"]["sha"] != info["second"]["sha"]


TREE_CLIENT = """
import json, sys
from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile
files = [f for f in HfApi(endpoint=sys.argv[1]).list_repo_tree(sys.argv[2], recursive=True) if isinstance(f, RepoFile)]
print(json.dumps({f.path: [f.size, f.blob_id, f.lfs.sha256 if f.lfs else None] for f in files}))
"""


def test_huggingface_hub_follows_the_trees_pages_and_reads_each_files_hashes(hf_python, tmp_path):
    with serve_hub(tmp_path, tree_page_size=2) as served:
        done = subprocess.run(
            [str(hf_python), "-c", TREE_CLIENT, served.url, REPO], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    lfs = (".safetensors", ".pth")
    assert json.loads(done.stdout) == {
        name: [
            len(data),
            git_blob_id(fake_hf_hub.lfs_pointer(sha256(data), len(data)) if name.endswith(lfs) else data),
            sha256(data) if name.endswith(lfs) else None,
        ]
        for name, data in FILES.items()
    }


# --- the tiny model ---------------------------------------------------------------------


def llama_tensor_names(layers: int) -> list[str]:
    """The tensors transformers saves for a Llama with tied word embeddings (no lm_head)."""
    per_layer = [
        "input_layernorm.weight",
        "mlp.down_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "post_attention_layernorm.weight",
        "self_attn.k_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_proj.weight",
        "self_attn.v_proj.weight",
    ]
    names = [f"model.layers.{i}.{name}" for i in range(layers) for name in per_layer]
    return ["model.embed_tokens.weight", *names, "model.norm.weight"]


def test_each_decoder_layer_the_embedding_and_the_norm_have_a_file_of_their_own():
    files: dict[str, set[str]] = {}
    for name in llama_tensor_names(tiny_model.LAYERS):
        files.setdefault(tiny_model.shard_of(name), set()).add(name.split(".")[2] if ".layers." in name else name)
    assert files == {
        "model-00001-of-00006.safetensors": {"model.embed_tokens.weight"},
        "model-00002-of-00006.safetensors": {"0"},
        "model-00003-of-00006.safetensors": {"1"},
        "model-00004-of-00006.safetensors": {"2"},
        "model-00005-of-00006.safetensors": {"3"},
        "model-00006-of-00006.safetensors": {"model.norm.weight"},
    }
    for unknown in ("lm_head.weight", f"model.layers.{tiny_model.LAYERS}.mlp.up_proj.weight"):
        with pytest.raises(ValueError, match="no weight file"):
            tiny_model.shard_of(unknown)


def safetensors_header(path: Path) -> dict:
    """A safetensors file's header (https://github.com/huggingface/safetensors#format):
    8 bytes of little-endian length, then that much JSON."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        return json.loads(file.read(length))


# transformers loads the shards through the index into the model that config.json
# describes, and every parameter equals the tensor of the file the index names.
LOADS = """
import json, sys, torch
from pathlib import Path
from safetensors import safe_open
from transformers import AutoModelForCausalLM
out = Path(sys.argv[1])
weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
model = AutoModelForCausalLM.from_pretrained(out)
state = model.state_dict()
for name, file in weight_map.items():
    with safe_open(out / file, "pt") as weights:
        assert torch.equal(state[name], weights.get_tensor(name)), name
assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tied"
print(len(weight_map))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The tiny model built twice, side by side, with the Python that has torch."""
    modules = ("torch", "transformers", "safetensors", "tokenizers")
    python = python_with(f"import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, {modules!r})))")
    if python is None:
        pytest.skip("no Python with torch and transformers here (the fleet's virtualenv has them)")
    outs = [tmp_path_factory.mktemp("tiny") / "model" for _ in range(2)]
    build = [str(python), str(Path(tiny_model.__file__))]
    with ThreadPoolExecutor(2) as pool:
        for done in pool.map(lambda out: subprocess.run([*build, str(out)], capture_output=True, text=True), outs):
            assert done.returncode == 0, done.stderr
    return python, outs[0], outs[1]


def test_the_tiny_model_is_sharded_with_an_index_that_tells_the_truth(built):
    python, out, _ = built
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert shards == [tiny_model.shard_file(i) for i in range(tiny_model.SHARDS)]
    assert not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    in_files = {}
    total = 0
    for shard in shards:
        for name, tensor in safetensors_header(out / shard).items():
            if name != "__metadata__":
                assert name not in in_files
                in_files[name] = shard
                start, end = tensor["data_offsets"]
                total += end - start
    assert index["weight_map"] == in_files
    assert sorted(in_files) == sorted(llama_tensor_names(tiny_model.LAYERS))
    assert index["metadata"]["total_size"] == total
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    done = subprocess.run([str(python), "-c", LOADS, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == str(len(in_files))


def test_the_tiny_model_is_the_same_bytes_every_time(built):
    _, first, second = built
    assert downloaded(first) == downloaded(second)
    assert len(downloaded(first)) == 12

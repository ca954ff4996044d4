"""engine_cache: vLLM's warm-up (its compile cache and the like) kept on the shared model cache.

Installed at /opt/vllm-cluster/lib/engine_cache.py by the nodes' setup command, beside
vllm_cluster_lib.py; scripts/node/engine-cache is its command line, and the program
imports it (`from scripts.lib import engine_cache`) to compute the key. Standard library
only: it runs with the node's virtualenv Python (3.12) and the repository's (3.11).

What vLLM keeps, and where (vLLM 0.32.0 as installed on the local hosts; paths below are
inside its package, `vllm/`):
- Everything under VLLM_CACHE_ROOT (envs.py:712-717, default ~/.cache/vllm or
  $XDG_CACHE_HOME/vllm). It is not part of vLLM's own cache hash (envs.py:2364, in
  compile_factors' ignored_factors), so a node's local root can be anywhere.
- torch.compile's output. With torch >= 2.10 vLLM compiles ahead of time by default
  (VLLM_USE_AOT_COMPILE, envs.py:378-386) into
  torch_compile_cache/torch_aot_compile/<hash>/rank_<rank>_<dp>/model, a file saved through
  a temporary name and os.replace (compilation/decorators.py:735-741), and points
  TORCHINDUCTOR_CACHE_DIR at torch_compile_cache/torch_aot_compile/<hash>/inductor_cache,
  one directory shared by every rank on the node (decorators.py:548-580). Without AOT
  (VLLM_COMPILE mode) the graphs go to torch_compile_cache/<hash>/rank_<rank>_<dp>/<prefix>/,
  whose index vllm_compile_cache.py is written in place, not atomically
  (compilation/backends.py:218-224, save_to_file), and the Inductor adaptor puts Inductor's
  and Triton's caches beside it (compiler_interface.py:455-475).
- <hash> is vLLM's own check that a cache fits: the vLLM version, the hash of the whole
  engine config (config/vllm.py:449-562: model incl. its path, revision, dtype and
  max_model_len, cache, parallel incl. TP and PP, scheduler's max_num_batched_tokens and
  max_num_seqs, compilation, ...), every VLLM_* variable not on the ignored list
  (envs.py:2351-2495), and torch/Inductor's own factors, which on a GPU include the
  device's name (compilation/caching.py:572-588, compiler_interface.py:165-185,
  torch/_inductor/codecache.py CacheBase.get_system). A cache under a wrong <hash> is
  never used: vLLM recompiles into a new one.
- gpu_p2p_access_cache_for_<visible GPUs>.json, the GPU peer-to-peer check
  (distributed/device_communicators/all_reduce_utils.py:344-420); it is keyed by the GPU
  indices only, not by the hardware, so its validity is the instance type's.
- modelinfos/<module>-<class>.json, the model class inspection that otherwise runs a
  subprocess at every start (model_executor/models/registry.py:966-1040), checked against
  the model module's hash.
- Not under VLLM_CACHE_ROOT: Inductor's precompiled C++ headers (CPU kernels) always go to
  tempfile.gettempdir()/torchinductor_<user>/precompiled_headers, whatever
  TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/codecache.py:3539-3543); Triton's JIT
  cache (the GPU build's own kernels) goes to TRITON_CACHE_DIR, default ~/.triton/cache
  (triton/knobs.py:349-355). The node sets TRITON_CACHE_DIR under the same local root so
  that it is kept too.

How it is kept (issue 20, point 4). Each node runs vLLM with a local VLLM_CACHE_ROOT
(root-only, /var/cache/vllm-cluster/vllm): vLLM writes parts of its cache in place and
names its temporaries by PID alone (decorators.py:739), which two nodes writing one EFS
directory would mix up. Before the engine starts, `seed` copies the complete pieces of the
shared copy (/mnt/vllm-models/warmup/<key>/) into the local root; after the engine served,
`publish` copies this node's pieces that the share lacks to it. A piece is the unit that
is complete on its own:
- a rank's directory (rank_<r>_<d>, torch_compile_cache/...), whole, once finished (its
  `model` or vllm_compile_cache.py is there): its files refer to each other (the index and
  the artifacts it names), so an unfinished one is not copied at all;
- a Triton kernel's directory (one holding a __grp__*.json), whole, for the same reason;
- every other regular file on its own (Inductor's kernels, AOTAutograd entries and
  compiled .so files are named by the hash of their content, the P2P check and model
  infos by what they describe).
A piece is copied to a temporary name in its final directory (TEMP_PREFIX, host, PID and
a random part: no two nodes pick the same) and then put in place in one step that never
replaces what is there: os.link for a file (EEXIST when another node was first), rename
of a directory (refused onto a non-empty directory). So a reader sees a piece whole or
not at all, two nodes publishing the same piece leave one, and a piece is never
overwritten. Temporaries are never seeded; one left by a node that died is removed by a
later publish once it is STALE_TEMP_SECONDS old. Symbolic links are never followed nor
copied, in either direction. Files on the share are 0644 (0755 when executable),
directories 0755, as the model tree: these are not secrets, but they are code the engine
loads (pickles and shared objects), as trustworthy as the share itself.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

# Bump when the layout or the key's inputs change: every key changes with it.
KEY_SCHEMA = 1
KEY_LENGTH = 16

# Our temporaries, on the share and in the local root. Never a piece.
TEMP_PREFIX = ".engine-cache-tmp."
# Other writers' temporaries, never a piece either: vLLM's `model.<pid>.tmp`
# (compilation/decorators.py:739), Inductor's `.<pid>.<thread>.tmp` (torch/_inductor/codecache.py
# write_atomic) and Triton's `tmp.pid_<pid>_<uuid>` directories (triton/runtime/cache.py put).
_FOREIGN_TEMP = re.compile(r"(\.tmp$)|(^tmp\.pid_)")
# Inductor's lock files (empty, <cache>/locks/<hash>.lock): no content to keep.
_LOCK_SUFFIX = ".lock"
# A rank's torch.compile directory (compilation/backends.py:1075-1083, decorators.py:583-585).
_RANK_DIR = re.compile(r"^rank_\d+_\d+$")
_RANK_COMPLETE = re.compile(r"^(model|vllm_compile_cache\.py)$")
# A Triton kernel directory holds its group file (triton/runtime/cache.py FileCacheManager).
_TRITON_GROUP = re.compile(r"^__grp__.*\.json$")
# A temporary of ours this old was left by a node that died while publishing: a piece is
# seconds to minutes of copying, never hours.
STALE_TEMP_SECONDS = 6 * 3600

SHARED_DIR_MODE = 0o755
SHARED_FILE_MODE = 0o644
LOCAL_ROOT_MODE = 0o700


class EngineCacheError(Exception):
    """A problem the caller can fix: the message names the path and what to do."""


# --- the key --------------------------------------------------------------------------

# Serve arguments that do not change what vLLM compiles, dropped from the key so that a
# node's address, the name clients use or a secret never makes a new key. Each with its
# source; anything not listed here is kept (an unknown argument costs at most a compile).
# Options followed by their value(s):
_DROPPED_WITH_VALUES = {
    # The API server's own options (entrypoints/launchers/cli_args.py:81-372, FrontendArgs): no engine config.
    "--host": "the API server's address",
    "--port": "the API server's port",
    "--uds": "the API server's socket",
    "--root-path": "the API server's path prefix",
    "--allowed-origins": "CORS",
    "--allowed-methods": "CORS",
    "--allowed-headers": "CORS",
    "--ssl-keyfile": "TLS",
    "--ssl-certfile": "TLS",
    "--ssl-ca-certs": "TLS",
    "--ssl-cert-reqs": "TLS",
    "--uvicorn-log-level": "logging",
    "--max-log-len": "logging",
    "--middleware": "the API server's middleware",
    "--chat-template": "the API server's prompt rendering",
    "--response-role": "the API server's responses",
    # The API key (cli_args.py:325), a secret; VLLM_API_KEY is ignored by compile_factors too (envs.py:2389).
    "--api-key": "a secret",
    # config/model.py:464-499 ModelConfig.compute_hash ignored_factors.
    "--served-model-name": "ModelConfig ignores served_model_name",
    "--tokenizer": "ModelConfig ignores tokenizer",
    "--tokenizer-mode": "ModelConfig ignores tokenizer_mode",
    "--tokenizer-revision": "ModelConfig ignores tokenizer_revision",
    "--seed": "ModelConfig ignores seed",
    # config/parallel.py:897-935 ParallelConfig.compute_hash ignored_factors.
    "--distributed-executor-backend": "ParallelConfig ignores distributed_executor_backend",
    "--max-parallel-loading-workers": "ParallelConfig ignores max_parallel_loading_workers",
    # config/cache.py:288-316 CacheConfig.compute_hash ignored_factors: the memory plan.
    "--gpu-memory-utilization": "CacheConfig ignores gpu_memory_utilization",
    "--kv-cache-memory-bytes": "CacheConfig ignores kv_cache_memory_bytes",
    "--num-gpu-blocks-override": "CacheConfig ignores num_gpu_blocks_override",
    # config/load.py:120-134 LoadConfig.compute_hash has no factors: how weights are read.
    "--load-format": "LoadConfig has no hash factors",
    "--safetensors-load-strategy": "LoadConfig has no hash factors",
    "--download-dir": "LoadConfig has no hash factors",
    "--model-loader-extra-config": "LoadConfig has no hash factors",
    "--ignore-patterns": "LoadConfig has no hash factors",
}
# Switches (no value). Every option in these tables is one of `vllm serve`'s in 0.32.0 (checked
# against its parser, entrypoints/launchers/cli_args.py:421 make_arg_parser).
_DROPPED_SWITCHES = {
    "--disable-log-stats",
    "--enable-log-requests",
    "--disable-uvicorn-access-log",
    "--disable-fastapi-docs",
    "--enable-request-id-headers",
    "--enable-prefix-caching",  # CacheConfig ignores enable_prefix_caching (config/cache.py:294)
    "--no-enable-prefix-caching",
    "--disable-custom-all-reduce",  # ParallelConfig ignores it (config/parallel.py:917)
}
# Given to warmup_key on their own; dropped from the serve arguments after a check that
# they agree, so that one value is not counted twice in two spellings.
_EXPLICIT = {
    "--tensor-parallel-size": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "--max-model-len": "max_model_len",
    "--revision": "revision",
    "--model": "model",
}
# vLLM's short spellings (engine/arg_utils.py:967-1177).
_ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-q": "--quantization"}
_NUMBER = re.compile(r"^-\d")


def _is_option(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token)


def _option_name(token: str) -> str:
    # vLLM's parser takes --max_model_len for --max-model-len (utils/argparse_utils.py:336-346).
    name = _ALIASES.get(token, token)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def graph_arguments(serve_args: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The serve arguments that may change what vLLM compiles, as (option, values) in a
    stable order: options sorted by name (their order on the command line does not
    matter to vLLM), repeats of one option kept in their order. The model given first
    (`vllm serve MODEL`) and everything in the tables above are dropped."""
    groups: list[tuple[str, list[str]]] = []
    tokens = list(serve_args)
    if tokens and not _is_option(tokens[0]):
        tokens = tokens[1:]  # `vllm serve MODEL ...`: the model's path, which warmup_key takes as model
    for token in tokens:
        if _is_option(token):
            name, has_value, value = token.partition("=")
            groups.append((_option_name(name), [value] if has_value else []))
        elif groups:
            groups[-1][1].append(token)
        else:
            groups.append(("", [token]))
    kept = [
        (name, tuple(values))
        for name, values in groups
        if name not in _DROPPED_WITH_VALUES and name not in _DROPPED_SWITCHES and name not in _EXPLICIT
    ]
    return sorted(kept, key=lambda group: group[0])


def _check_explicit(serve_args: list[str], given: dict[str, object]) -> None:
    """A serve argument that says another TP, PP, max-model-len, revision or model than
    the one given to warmup_key is a caller's bug: say which."""
    tokens = list(serve_args)
    for index, token in enumerate(tokens):
        if not _is_option(token):
            continue
        name, has_value, value = token.partition("=")
        field_name = _EXPLICIT.get(_option_name(name))
        if field_name is None:
            continue
        if not has_value:
            value = tokens[index + 1] if index + 1 < len(tokens) else ""
        if field_name == "model":
            continue  # --model is the model's path (as the positional one), not its name
        expected = given[field_name]
        if expected is None or str(expected) != value:
            raise ValueError(
                f"serve argument {name} {value} disagrees with {field_name}={expected!r} given to warmup_key: "
                "pass the same value to both"
            )


def warmup_key(
    vllm_version: str,
    model: str,
    revision: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    max_model_len: int | None,
    serve_args: list[str],
    *,
    hardware: str = "",
) -> str:
    """The name of the shared copy of vLLM's warm-up for this configuration
    (/mnt/vllm-models/warmup/<key>): KEY_LENGTH hex digits of the SHA-256 of what changes
    the compiled graphs. Serve arguments that do not (graph_arguments) are dropped, so
    the head's address, the port, the served name and the model's path (the model and
    revision are inputs of their own) never change it.

    `hardware` (the instance type) belongs in the key: the compiled graphs carry their
    own check of the GPU (vLLM's <hash> includes the device name), but the peer-to-peer
    check's file does not (all_reduce_utils.py:358-368, named by GPU indices only), and
    a g6e's answer is wrong on a p5. Without it, a stack whose instance type changes
    reuses the old type's P2P answer.

    The key only groups; vLLM's own <hash> inside it decides whether a cache fits, so a
    factor this key misses costs a compile on the first start after the change, never
    a wrong graph."""
    _check_explicit(
        serve_args,
        {
            "tensor_parallel": tensor_parallel,
            "pipeline_parallel": pipeline_parallel,
            "max_model_len": max_model_len,
            "revision": revision,
        },
    )
    factors = {
        "schema": KEY_SCHEMA,
        "vllm": vllm_version,
        "model": model,
        "revision": revision,
        "tensor_parallel": int(tensor_parallel),
        "pipeline_parallel": int(pipeline_parallel),
        "max_model_len": None if max_model_len is None else int(max_model_len),
        "hardware": hardware,
        "args": [[name, list(values)] for name, values in graph_arguments(serve_args)],
    }
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
    return digest[:KEY_LENGTH]


# --- pieces -----------------------------------------------------------------------------


def _skipped_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX) or bool(_FOREIGN_TEMP.search(name)) or name.endswith(_LOCK_SUFFIX)


def _holds(path: Path, pattern: re.Pattern[str], depth: int) -> bool:
    """A regular file whose name matches, in path or its subdirectories down to depth."""
    try:
        with os.scandir(path) as iterator:
            entries = list(iterator)
    except OSError:
        return False
    for entry in entries:
        if entry.is_file(follow_symlinks=False) and pattern.match(entry.name):
            return True
    return depth > 0 and any(
        _holds(Path(entry.path), pattern, depth - 1)
        for entry in entries
        if entry.is_dir(follow_symlinks=False) and not _skipped_name(entry.name)
    )


def _directory_kind(path: Path, name: str) -> str:
    """'piece' (a whole directory piece), 'incomplete' (one that is not finished: neither a
    piece nor walked into, so that none of its files travels alone) or 'tree' (walked)."""
    if _RANK_DIR.match(name):
        # Finished when its artifact is there: `model`, saved last through os.replace in AOT
        # mode (decorators.py:735-741), or the index vllm_compile_cache.py in a prefix's
        # directory, written once every graph compiled (backends.py:218-224).
        return "piece" if _holds(path, _RANK_COMPLETE, 1) else "incomplete"
    if _holds(path, _TRITON_GROUP, 0):
        return "piece"  # Triton writes a kernel's group file after its other files
    return "tree"


@dataclass
class Scan:
    """The complete pieces under a root, as paths relative to it ('/'-separated), sorted;
    the symbolic links met (never followed)."""

    pieces: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)


def scan(root: Path) -> Scan:
    """Every piece under root (see the module's docstring), never following a link."""
    result = Scan()
    if not root.is_dir() or root.is_symlink():
        return result

    def walk(directory: Path, relative: str) -> None:
        with os.scandir(directory) as iterator:
            entries = sorted(iterator, key=lambda entry: entry.name)
        for entry in entries:
            rel = f"{relative}{entry.name}"
            if _skipped_name(entry.name):
                continue
            if entry.is_symlink():
                result.symlinks.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                kind = _directory_kind(Path(entry.path), entry.name)
                if kind == "piece":
                    result.pieces.append(rel)
                elif kind == "tree":
                    walk(Path(entry.path), rel + "/")
            elif entry.is_file(follow_symlinks=False):
                result.pieces.append(rel)

    walk(root, "")
    return result


def _piece_size(path: Path) -> int:
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    total = 0
    for directory, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = [d for d in dirnames if not _skipped_name(d)]
        for name in filenames:
            child = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(child.st_mode) and not _skipped_name(name):
                total += child.st_size
    return total


def _temp_name(final_name: str) -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
    return f"{TEMP_PREFIX}{host}.{os.getpid()}.{secrets.token_hex(4)}.{final_name}"


def _file_mode(source_mode: int) -> int:
    return 0o755 if source_mode & 0o111 else SHARED_FILE_MODE


def _copy_file(source: Path, target: Path) -> int:
    """source (a regular file, checked without following links) -> target, a new file."""
    info = os.lstat(source)
    if not stat.S_ISREG(info.st_mode):
        raise EngineCacheError(f"{source} is not a regular file any more: run the command again")
    # O_NOFOLLOW: a link swapped in after the check is refused, not followed.
    source_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(source_fd, "rb") as reader:
        target_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _file_mode(info.st_mode))
        with os.fdopen(target_fd, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
            writer.flush()
            os.fsync(writer.fileno())
    os.chmod(target, _file_mode(info.st_mode))
    return info.st_size


def _copy_tree(source: Path, target: Path) -> int:
    """A directory piece, without links and temporaries, into target (new)."""
    os.mkdir(target, SHARED_DIR_MODE)
    os.chmod(target, SHARED_DIR_MODE)
    copied = 0
    with os.scandir(source) as iterator:
        entries = sorted(iterator, key=lambda entry: entry.name)
    for entry in entries:
        if _skipped_name(entry.name) or entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            copied += _copy_tree(Path(entry.path), target / entry.name)
        elif entry.is_file(follow_symlinks=False):
            copied += _copy_file(Path(entry.path), target / entry.name)
    return copied


def _ensure_parent(root: Path, relative: str) -> Path:
    """The directory that holds `relative` under root, made 0755 as needed; a link or a
    file where a directory belongs is refused (never followed out of the tree)."""
    return _ensure_directory(root, relative.split("/")[:-1])


def _ensure_directory(root: Path, parts: list[str]) -> Path:
    """root/parts..., each missing directory made 0755 itself (os.makedirs would give all
    but the last the process's umask, and the node script's is 077); a link or a file
    where a directory belongs is refused."""
    directory = root
    for part in parts:
        directory = directory / part
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            try:
                os.mkdir(directory, SHARED_DIR_MODE)
                os.chmod(directory, SHARED_DIR_MODE)
            except FileExistsError:
                pass  # another node made it just now; checked below
            info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode):
            raise EngineCacheError(
                f"{directory} is not a directory (a link or a file): engine-cache never follows links out of "
                f"its tree; remove it (`rm {directory}`) and run the command again"
            )
    return directory


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _place(source: Path, root: Path, relative: str) -> int | None:
    """Copies the piece `source` to root/relative through a temporary name and puts it in
    place without replacing anything: the bytes copied, or None when root/relative was
    there already (before or by another writer meanwhile)."""
    parent = _ensure_parent(root, relative)
    final = parent / relative.rsplit("/", 1)[-1]
    if os.path.lexists(final):
        return None
    temp = parent / _temp_name(final.name)
    try:
        if stat.S_ISDIR(os.lstat(source).st_mode):
            copied = _copy_tree(source, temp)
            try:
                os.rename(temp, final)  # refused onto a directory that is not empty
            except OSError as error:
                if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR) and os.path.lexists(final):
                    return None
                raise
        else:
            copied = _copy_file(source, temp)
            try:
                os.link(temp, final)  # never replaces: EEXIST when another writer was first
            except FileExistsError:
                return None
        return copied
    finally:
        if os.path.lexists(temp):
            _remove(temp)


@dataclass
class Transfer:
    """What seed or publish did."""

    copied: int = 0
    copied_bytes: int = 0
    present: int = 0
    found: int = 0
    symlinks: int = 0
    stale_temps_removed: int = 0


def _transfer(source_root: Path, target_root: Path) -> Transfer:
    found = scan(source_root)
    result = Transfer(found=len(found.pieces), symlinks=len(found.symlinks))
    for relative in found.pieces:
        copied = _place(source_root / relative, target_root, relative)
        if copied is None:
            result.present += 1
        else:
            result.copied += 1
            result.copied_bytes += copied
    return result


def _check_root(path: Path, role: str, fix: str) -> None:
    if path.is_symlink():
        raise EngineCacheError(f"the {role} {path} is a symbolic link: engine-cache never follows one; {fix}")
    if path.exists() and not path.is_dir():
        raise EngineCacheError(f"the {role} {path} is not a directory: {fix}")


def seed(shared: Path, local: Path) -> Transfer:
    """The shared copy's complete pieces that the local root lacks, copied into it
    (made root-only when new). Nothing on the share yet is no error: the first start of
    a configuration compiles."""
    _check_root(local, "local cache", "point --local at the node's own directory (VLLM_CACHE_ROOT)")
    _check_root(shared, "shared copy", "point --shared at /mnt/vllm-models/warmup/<key>")
    if not local.exists():
        os.makedirs(local, LOCAL_ROOT_MODE)
        os.chmod(local, LOCAL_ROOT_MODE)
    if not shared.is_dir():
        return Transfer()
    return _transfer(shared, local)


def remove_stale_temps(shared: Path, older_than: float = STALE_TEMP_SECONDS, now: float | None = None) -> int:
    """Temporaries of ours under shared whose newest file is older than `older_than`
    seconds: left by a node that died while publishing. A younger one may be another
    node's copy in progress and stays."""
    now = time.time() if now is None else now
    removed = 0
    for directory, dirnames, filenames in os.walk(shared, followlinks=False):
        for name in [*dirnames, *filenames]:
            if not name.startswith(TEMP_PREFIX):
                continue
            path = Path(directory) / name
            try:
                if now - _newest_mtime(path) >= older_than:
                    _remove(path)
                    removed += 1
            except FileNotFoundError:
                # Gone while we looked: its node put it in place or removed it, as a node
                # publishing at the same time does (one in progress is never ours to take).
                continue
        dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
    return removed


def _newest_mtime(path: Path) -> float:
    newest = os.lstat(path).st_mtime
    if path.is_dir() and not path.is_symlink():
        for directory, _dirnames, filenames in os.walk(path, followlinks=False):
            newest = max(newest, os.lstat(directory).st_mtime)
            for name in filenames:
                newest = max(newest, os.lstat(os.path.join(directory, name)).st_mtime)
    return newest


def publish(local: Path, shared: Path) -> Transfer:
    """This node's pieces that the shared copy lacks, put there one by one; what is
    there is kept. Run after the engine served (its compile is over)."""
    _check_root(local, "local cache", "point --local at the node's own directory (VLLM_CACHE_ROOT)")
    _check_root(shared, "shared copy", "point --shared at /mnt/vllm-models/warmup/<key>")
    if not local.is_dir():
        raise EngineCacheError(
            f"the local cache {local} does not exist: the engine did not write there. Check that "
            "VLLM_CACHE_ROOT in /etc/vllm-cluster/node.env names it and reaches the engine (vllm.service and "
            "the Ray units read node.env), then restart the engine and publish again"
        )
    if not shared.exists():
        parent = shared.parent
        _check_root(parent, "shared warm-up root", "it must be a directory on the model cache")
        existing = next(directory for directory in shared.parents if directory.exists())
        _ensure_directory(existing, list(shared.relative_to(existing).parts))
    result = _transfer(local, shared)
    result.stale_temps_removed = remove_stale_temps(shared)
    return result


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"

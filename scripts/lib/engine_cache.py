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
copied, in either direction: every walk goes through descriptors, each directory opened
from its parent's with O_NOFOLLOW|O_DIRECTORY, modes set with fchmod (the section
"pieces"). Files on the share are 0644 (0755 when executable),
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
#
# Every walk of a tree here, on the share as in the local root, goes through descriptors:
# a directory is opened from its parent's descriptor with O_NOFOLLOW|O_DIRECTORY, a file
# with O_NOFOLLOW, a mode is set with fchmod on what was opened, and names are made,
# linked, renamed and removed relative to their directory's descriptor. So another node
# that swaps a directory or a temporary of ours for a link (to /etc, say) while we walk
# gets ELOOP/ENOTDIR, never a root process writing, reading or chmod-ing through it.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _skipped_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX) or bool(_FOREIGN_TEMP.search(name)) or name.endswith(_LOCK_SUFFIX)


def _open_dir_at(dir_fd: int, name: str, shown: Path | str) -> int:
    """The directory `name` in `dir_fd`, refused when it is a link or not a directory."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise EngineCacheError(
                f"{shown} is not a directory (a link or a file): engine-cache never follows links out of its "
                f"tree; remove it (`rm {shown}`) and run the command again"
            ) from error
        raise


def _open_root(path: Path, role: str, fix: str) -> int:
    """The directory `path`, its last component not a link (the caller's own root: the
    components above it are the host's, /mnt/vllm-models or /var/cache)."""
    parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _open_dir_at(parent_fd, path.name, path)
    except EngineCacheError as error:
        raise EngineCacheError(f"the {role} {path} is a symbolic link or not a directory: {fix}") from error
    finally:
        os.close(parent_fd)


def _entries(dir_fd: int) -> list[os.DirEntry]:
    with os.scandir(dir_fd) as iterator:
        return sorted(iterator, key=lambda entry: entry.name)


def _holds(dir_fd: int, pattern: re.Pattern[str], depth: int) -> bool:
    """A regular file whose name matches, in the directory or its subdirectories down to depth."""
    entries = _entries(dir_fd)
    for entry in entries:
        if entry.is_file(follow_symlinks=False) and pattern.match(entry.name):
            return True
    if depth <= 0:
        return False
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and not _skipped_name(entry.name):
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # gone or swapped for a link since it was listed: it holds nothing of ours
            try:
                if _holds(child, pattern, depth - 1):
                    return True
            finally:
                os.close(child)
    return False


def _directory_kind(dir_fd: int, name: str) -> str:
    """'piece' (a whole directory piece), 'incomplete' (one that is not finished: neither a
    piece nor walked into, so that none of its files travels alone) or 'tree' (walked)."""
    if _RANK_DIR.match(name):
        # Finished when its artifact is there: `model`, saved last through os.replace in AOT
        # mode (decorators.py:735-741), or the index vllm_compile_cache.py in a prefix's
        # directory, written once every graph compiled (backends.py:218-224).
        return "piece" if _holds(dir_fd, _RANK_COMPLETE, 1) else "incomplete"
    if _holds(dir_fd, _TRITON_GROUP, 0):
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

    def walk(dir_fd: int, relative: str) -> None:
        for entry in _entries(dir_fd):
            rel = f"{relative}{entry.name}"
            if _skipped_name(entry.name):
                continue
            if entry.is_symlink():
                result.symlinks.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError as error:
                    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    result.symlinks.append(rel)  # swapped for a link since it was listed
                    continue
                try:
                    kind = _directory_kind(child, entry.name)
                    if kind == "piece":
                        result.pieces.append(rel)
                    elif kind == "tree":
                        walk(child, rel + "/")
                finally:
                    os.close(child)
            elif entry.is_file(follow_symlinks=False):
                result.pieces.append(rel)

    root_fd = _open_root(root, "root", "point it at a directory")
    try:
        walk(root_fd, "")
    finally:
        os.close(root_fd)
    return result


def _temp_name(final_name: str) -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
    return f"{TEMP_PREFIX}{host}.{os.getpid()}.{secrets.token_hex(4)}.{final_name}"


def _file_mode(source_mode: int) -> int:
    return 0o755 if source_mode & 0o111 else SHARED_FILE_MODE


def _copy_file(source_fd: int, target_dir_fd: int, name: str) -> int:
    """The regular file open at source_fd -> a new file `name` in target_dir_fd."""
    info = os.fstat(source_fd)
    if not stat.S_ISREG(info.st_mode):
        raise EngineCacheError(f"{name} is not a regular file any more: run the command again")
    mode = _file_mode(info.st_mode)
    # O_EXCL|O_NOFOLLOW: a new file of ours, never a link someone put at its name.
    target_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=target_dir_fd)
    with os.fdopen(os.dup(source_fd), "rb") as reader, os.fdopen(target_fd, "wb") as writer:
        reader.seek(0)
        shutil.copyfileobj(reader, writer, 1 << 20)
        writer.flush()
        os.fchmod(writer.fileno(), mode)  # the umask does not decide it
        os.fsync(writer.fileno())
    return info.st_size


def _make_dir(parent_fd: int, name: str, shown: Path | str) -> int:
    """A new directory `name` in parent_fd, 0755 set on what was opened (fchmod), never
    through a link another writer put in its place."""
    try:
        os.mkdir(name, SHARED_DIR_MODE, dir_fd=parent_fd)
    except FileExistsError:
        raise
    except OSError as error:
        # Relative to a descriptor the error names `name` alone: name the whole path.
        raise OSError(error.errno, error.strerror, str(shown)) from error
    fd = _open_dir_at(parent_fd, name, shown)
    os.fchmod(fd, SHARED_DIR_MODE)
    return fd


def _copy_tree(source_fd: int, target_parent_fd: int, name: str, shown: Path | str) -> int:
    """The directory open at source_fd, without links and temporaries, into a new
    directory `name` of target_parent_fd."""
    target_fd = _make_dir(target_parent_fd, name, shown)
    copied = 0
    try:
        for entry in _entries(source_fd):
            if _skipped_name(entry.name) or entry.is_symlink():
                continue
            flags = _DIR_FLAGS if entry.is_dir(follow_symlinks=False) else os.O_RDONLY | os.O_NOFOLLOW
            if not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
                continue
            try:
                child = os.open(entry.name, flags, dir_fd=source_fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # swapped for a link since it was listed: never followed
                raise
            try:
                if entry.is_dir(follow_symlinks=False):
                    copied += _copy_tree(child, target_fd, entry.name, f"{shown}/{entry.name}")
                else:
                    copied += _copy_file(child, target_fd, entry.name)
            finally:
                os.close(child)
    finally:
        os.close(target_fd)
    return copied


def _ensure_directory_at(root_fd: int, root: Path, parts: list[str]) -> int:
    """A descriptor of root/parts..., each missing directory made 0755 itself (os.makedirs
    would give all but the last the process's umask, and the node script's is 077); a link
    or a file where a directory belongs is refused, never followed out of the tree."""
    fd = os.dup(root_fd)
    shown = root
    try:
        for part in parts:
            shown = shown / part
            try:
                child = _make_dir(fd, part, shown)
            except FileExistsError:
                child = _open_dir_at(fd, part, shown)  # there before, or another node made it just now
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_at(dir_fd: int, name: str) -> None:
    """`name` in dir_fd gone: a directory with what it holds (shutil.rmtree through
    descriptors, which never follows a link), anything else unlinked (a link itself)."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _open_piece(root_fd: int, relative: str) -> tuple[int, int] | None:
    """(parent's descriptor, piece's descriptor) of root/relative, or None when a component
    of it is a link (or gone) now: another writer changed the tree since the scan."""
    parts = relative.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        flags = _DIR_FLAGS if stat.S_ISDIR(info.st_mode) else os.O_RDONLY | os.O_NOFOLLOW
        piece = os.open(parts[-1], flags, dir_fd=fd)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            return None
        raise
    return fd, piece


def _place(source_fd: int, target_root_fd: int, target_root: Path, relative: str) -> int | None:
    """Copies the piece open at source_fd to target_root/relative through a temporary name
    and puts it in place without replacing anything: the bytes copied, or None when
    target_root/relative was there already (before or by another writer meanwhile)."""
    *parents, final = relative.split("/")
    parent_fd = _ensure_directory_at(target_root_fd, target_root, parents)
    shown = target_root.joinpath(*parents)
    temp = _temp_name(final)
    made = False
    try:
        try:
            os.stat(final, dir_fd=parent_fd, follow_symlinks=False)
            return None
        except FileNotFoundError:
            made = True  # the name is free: ours to fill through a temporary
        if stat.S_ISDIR(os.fstat(source_fd).st_mode):
            copied = _copy_tree(source_fd, parent_fd, temp, shown / temp)
            try:
                # Refused onto a directory that is not empty.
                os.rename(temp, final, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            except OSError as error:
                if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR) and _exists_at(parent_fd, final):
                    return None
                raise
        else:
            copied = _copy_file(source_fd, parent_fd, temp)
            try:
                # Never replaces: EEXIST when another writer was first.
                os.link(temp, final, src_dir_fd=parent_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
            except FileExistsError:
                return None
        return copied
    finally:
        if made and _exists_at(parent_fd, temp):
            _remove_at(parent_fd, temp)
        os.close(parent_fd)


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


@dataclass
class Transfer:
    """What seed or publish did."""

    copied: int = 0
    copied_bytes: int = 0
    present: int = 0
    found: int = 0
    symlinks: int = 0
    stale_temps_removed: int = 0


def _transfer(source_root: Path, target_root: Path, source_fd: int, target_fd: int) -> Transfer:
    found = scan(source_root)
    result = Transfer(found=len(found.pieces), symlinks=len(found.symlinks))
    for relative in found.pieces:
        opened = _open_piece(source_fd, relative)
        if opened is None:
            result.symlinks += 1  # a link (or nothing) there now: never followed, not copied
            continue
        parent_fd, piece_fd = opened
        try:
            copied = _place(piece_fd, target_fd, target_root, relative)
        finally:
            os.close(piece_fd)
            os.close(parent_fd)
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


LOCAL_FIX = "point --local at the node's own directory (VLLM_CACHE_ROOT)"
SHARED_FIX = "point --shared at /mnt/vllm-models/warmup/<key>"


def seed(shared: Path, local: Path) -> Transfer:
    """The shared copy's complete pieces that the local root lacks, copied into it
    (made root-only when new). Nothing on the share yet is no error: the first start of
    a configuration compiles."""
    _check_root(local, "local cache", LOCAL_FIX)
    _check_root(shared, "shared copy", SHARED_FIX)
    if not local.exists():
        os.makedirs(local.parent, exist_ok=True)
        parent_fd = os.open(local.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.mkdir(local.name, LOCAL_ROOT_MODE, dir_fd=parent_fd)
            fd = _open_dir_at(parent_fd, local.name, local)
            os.fchmod(fd, LOCAL_ROOT_MODE)
            os.close(fd)
        finally:
            os.close(parent_fd)
    if not shared.is_dir():
        return Transfer()
    shared_fd = _open_root(shared, "shared copy", SHARED_FIX)
    try:
        local_fd = _open_root(local, "local cache", LOCAL_FIX)
        try:
            return _transfer(shared, local, shared_fd, local_fd)
        finally:
            os.close(local_fd)
    finally:
        os.close(shared_fd)


def remove_stale_temps(shared: Path, older_than: float = STALE_TEMP_SECONDS, now: float | None = None) -> int:
    """Temporaries of ours under shared whose newest file is older than `older_than`
    seconds: left by a node that died while publishing. A younger one may be another
    node's copy in progress and stays. Walked through descriptors (os.fwalk, never into a
    link), removed relative to their directory's."""
    now = time.time() if now is None else now
    removed = 0
    shared_fd = _open_root(shared, "shared copy", SHARED_FIX)
    try:
        for _directory, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=shared_fd, follow_symlinks=False):
            for name in [*dirnames, *filenames]:
                if not name.startswith(TEMP_PREFIX):
                    continue
                try:
                    if now - _newest_mtime(dir_fd, name) >= older_than:
                        _remove_at(dir_fd, name)
                        removed += 1
                except FileNotFoundError:
                    # Gone while we looked: its node put it in place or removed it, as a node
                    # publishing at the same time does (one in progress is never ours to take).
                    continue
            dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
    finally:
        os.close(shared_fd)
    return removed


def _newest_mtime(dir_fd: int, name: str) -> float:
    """The newest mtime of `name` in dir_fd and, for a directory, of all below it."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    newest = info.st_mtime
    if stat.S_ISDIR(info.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            for _directory, _dirnames, filenames, sub_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                newest = max(newest, os.fstat(sub_fd).st_mtime)
                for child in filenames:
                    newest = max(newest, os.stat(child, dir_fd=sub_fd, follow_symlinks=False).st_mtime)
        finally:
            os.close(fd)
    return newest


def publish(local: Path, shared: Path) -> Transfer:
    """This node's pieces that the shared copy lacks, put there one by one; what is
    there is kept. Run after the engine served (its compile is over)."""
    _check_root(local, "local cache", LOCAL_FIX)
    _check_root(shared, "shared copy", SHARED_FIX)
    if not local.is_dir():
        raise EngineCacheError(
            f"the local cache {local} does not exist: the engine did not write there. Check that "
            "VLLM_CACHE_ROOT in /etc/vllm-cluster/node.env names it and reaches the engine (vllm.service and "
            "the Ray units read node.env), then restart the engine and publish again"
        )
    # The warm-up root (/mnt/vllm-models/warmup) is on the share too: opened without
    # following a link, and the key's directory made through its descriptor.
    _check_root(shared.parent, "shared warm-up root", "it must be a directory on the model cache")
    if not shared.parent.exists():
        existing = next(directory for directory in shared.parents if directory.exists())
        existing_fd = _open_root(existing, "shared warm-up root", "it must be a directory on the model cache")
        try:
            os.close(_ensure_directory_at(existing_fd, existing, list(shared.parent.relative_to(existing).parts)))
        finally:
            os.close(existing_fd)
    warmup_fd = _open_root(shared.parent, "shared warm-up root", "it must be a directory on the model cache")
    try:
        shared_fd = _ensure_directory_at(warmup_fd, shared.parent, [shared.name])
    finally:
        os.close(warmup_fd)
    try:
        local_fd = _open_root(local, "local cache", LOCAL_FIX)
        try:
            result = _transfer(local, shared, local_fd, shared_fd)
        finally:
            os.close(local_fd)
    finally:
        os.close(shared_fd)
    result.stale_temps_removed = remove_stale_temps(shared)
    return result


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"

"""TEST DOUBLE of the Hugging Face Hub, for the local fleet (which has no internet).

Serves model repositories from a directory (`ROOT/<org>/<name>/<file>`) over plain
HTTP with the part of the Hub's API that huggingface_hub 2.4.0 (components/versions.py
HF_HUB_VERSION: the `hf` CLI the nodes run) uses, answered as the Hub answers it
(huggingface_hub/hf_api.py ModelInfo, RepoSibling, RepoFile, RepoFolder and
_iter_repo_tree_pages; file_download.py get_hf_file_metadata and http_get;
utils/_http.py hf_raise_for_status for the error codes):

  GET       /api/models/{org}/{name}[/revision/{rev}][?blobs=true]
            model info (HfApi.model_info / repo_info, and what `hf download` asks
            first): the commit `sha` and `siblings`; with blobs (files_metadata=True)
            each sibling's `size`, `blobId` and, for an LFS file, `lfs` {size, sha256,
            pointerSize}.
  GET       /api/models/{org}/{name}/tree/{rev}[/{path}][?recursive=true]
            the file tree (HfApi.list_repo_tree, and `hf download` after the model
            info): files with `size`, `oid` (the git blob id: sha1 of "blob <size>\\0"
            and the bytes, of the LFS pointer for an LFS file) and `lfs` {oid (the
            file's sha256), size, pointerSize}, folders with their `oid`; one level, or
            everything below with recursive. In pages of `tree_page_size` entries (the
            Hub's 1,000), each but the last naming the next in a Link header
            (`<URL&cursor=...>; rel="next"`, which huggingface_hub follows:
            utils/_pagination.py _get_next_page).
  HEAD, GET /{org}/{name}/resolve/{rev}/{path}
            a file, with the headers the client checks: X-Repo-Commit, ETag (an LFS
            file's sha256, another file's git blob id), X-Linked-Etag and X-Linked-Size
            for an LFS file, Content-Length; a Range from a byte on (resumption).

Revisions: any branch or tag name resolves to the repository's files as they are
(`main`, or any other name a stack's modelRevision gives). Its commit is a hash of the
repository, the name and the files (`revision_commit`), so two names have different
commits and the same name keeps its commit while the files do not change. A commit
(40 hex digits, as huggingface_hub tells them apart: REGEX_COMMIT_HASH) resolves when
this hub gave it out for the files as they are, or it is main's (`revision_commit(ROOT,
REPO, "main")`, which a stack may name as its modelRevision), else it is RevisionNotFound.

What the real Hub does that this one does not: it redirects an LFS file's resolve to
its CDN (302, Location, the same X-Linked-* headers), where this one sends the file
itself (the client downloads from the resolve URL then, file_download.py
_get_metadata_or_catch_error); it stores new files in Xet and names their `xetHash`,
which would make the client fetch them from a Xet server (none here); its tree cursor
is opaque, where this one's is the offset; and it knows repositories without an
organisation (`gpt2`).

Every file it sends (a GET of resolve) is a line of the log (--log), JSON: repo, file,
revision (as the URL named it: the client asks by commit), commit, start (the first
byte sent: more than 0 for a resumption), bytes (sent) and size (the file's).
`download_counts(log)` counts the downloads of each file, so a test can prove each
file was downloaded once across the nodes.

    python fake_hf_hub.py --root DIR --host 10.99.0.254 --port 8765 --log requests.jsonl
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlparse

# How huggingface_hub tells a commit from a branch or tag name (constants.py REGEX_COMMIT_HASH).
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# The files the Hub keeps in LFS: what the .gitattributes it writes into every new
# repository sends there (e.g. https://huggingface.co/datasets/OpenRubrics/OpenRubric-Science/commit/dd7c44faae6d424ea123ef6cd21d539be30c0764,
# the lines it removed), and any file over 10 MB, which git on the Hub refuses
# (https://huggingface.co/docs/hub/repositories-getting-started: "files larger than 10MB" need LFS).
LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
    "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
    "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*",
    "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*",
)  # fmt: skip
LFS_MIN_BYTES = 10 * 1024 * 1024  # [unverified] whether the Hub counts 10 MB in MiB
# Entries per page of a tree: the Hub's cap without expand (huggingface_hub 2.4.0
# hf_api.py _list_repo_tree_pages: "1000 entries per page, 50 when expand=True").
TREE_PAGE_SIZE = 1000


@dataclass(frozen=True)
class Blob:
    """One file of a repository as the Hub describes it."""

    path: str  # relative to the repository, with "/"
    size: int
    sha256: str
    lfs: bool
    # The git blob id: of the file itself, or of its LFS pointer when the file is in LFS.
    oid: str
    pointer_size: int


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer git keeps for an LFS file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_oid(data: bytes) -> str:
    """The id git gives a blob: sha1 of "blob <size>\\0" and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def in_lfs(path: str, size: int) -> bool:
    return size > LFS_MIN_BYTES or any(fnmatch.fnmatch(path, pattern) for pattern in LFS_PATTERNS)


def tree_entry(blob: Blob) -> dict:
    """A file's entry in the Hub's tree listing (huggingface_hub hf_api.py RepoFile reads it)."""
    entry: dict = {"type": "file", "oid": blob.oid, "size": blob.size, "path": blob.path}
    if blob.lfs:
        entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
    return entry


_blob_cache: dict[tuple[str, int, int], Blob] = {}
_blob_cache_lock = threading.Lock()


def describe(path: Path, relative: str) -> Blob:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _blob_cache_lock:
        cached = _blob_cache.get(key)
    if cached is not None and cached.path == relative:
        return cached
    data = path.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    lfs = in_lfs(relative, len(data))
    pointer = lfs_pointer(sha256, len(data))
    blob = Blob(
        path=relative,
        size=len(data),
        sha256=sha256,
        lfs=lfs,
        oid=git_blob_oid(pointer if lfs else data),
        pointer_size=len(pointer) if lfs else 0,
    )
    with _blob_cache_lock:
        _blob_cache[key] = blob
    return blob


def repo_blobs(root: Path, repo: str) -> list[Blob]:
    """The repository's files, sorted by path (none when it does not exist)."""
    base = root / repo
    if not base.is_dir():
        return []
    return [describe(p, p.relative_to(base).as_posix()) for p in sorted(base.rglob("*")) if p.is_file()]


def content_digest(blobs: list[Blob]) -> str:
    digest = hashlib.sha1()
    for blob in blobs:
        digest.update(f"{blob.path}\0{blob.sha256}\0".encode())
    return digest.hexdigest()


def commit_of(repo: str, revision: str, digest: str) -> str:
    return hashlib.sha1(f"{repo}\0{revision}\0{digest}".encode()).hexdigest()


def revision_commit(root: Path, repo: str, revision: str) -> str:
    """The commit a branch or tag name resolves to, for the repository's files as they are."""
    return commit_of(repo, revision, content_digest(repo_blobs(root, repo)))


def folders_of(blobs: list[Blob]) -> list[str]:
    return sorted({str(parent) for blob in blobs for parent in Path(blob.path).parents if str(parent) != "."})


def read_log(log: Path) -> list[dict]:
    """Every file the hub sent, in order, one entry per GET (see the module's docstring)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def download_counts(log: Path, repo: str | None = None, commit: str | None = None) -> dict[str, int]:
    """file -> how many times it was downloaded (of one repository, of one commit).
    A download is a GET from the file's first byte; a GET from a later byte resumes a
    download that stopped (huggingface_hub's http_get sends a Range then) and is not
    counted again."""
    return dict(
        Counter(
            entry["file"]
            for entry in read_log(log)
            if entry["start"] == 0
            and (repo is None or entry["repo"] == repo)
            and (commit is None or entry["commit"] == commit)
        )
    )


class Hub:
    """The repositories under `root`, the commits given out, and the download log."""

    def __init__(self, root: Path, log_path: Path | None):
        self.root = root
        self.log_path = log_path
        self.lock = threading.Lock()
        # commit -> (repo, content digest) for every commit a name resolved to.
        self.commits: dict[str, tuple[str, str]] = {}

    def resolve(self, repo: str, revision: str, blobs: list[Blob]) -> str | None:
        """The commit `revision` names for these files, None when it names none."""
        digest = content_digest(blobs)
        if COMMIT.match(revision):
            with self.lock:
                known = self.commits.get(revision)
            # main's commit is known from the start: a test may name it before any name was asked.
            return revision if known == (repo, digest) or revision == commit_of(repo, "main", digest) else None
        commit = commit_of(repo, revision, digest)
        with self.lock:
            self.commits[commit] = (repo, digest)
        return commit

    def record(self, entry: dict) -> None:
        if self.log_path is None:
            return
        with self.lock, self.log_path.open("a") as log:
            log.write(json.dumps(entry) + "\n")


def make_handler(root: Path, log_path: Path | None, tree_page_size: int = TREE_PAGE_SIZE):
    if tree_page_size < 1:
        raise ValueError(f"tree_page_size must be at least 1, not {tree_page_size}")
    hub = Hub(root, log_path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def json(self, payload, head: bool) -> None:
            self.send(200, json.dumps(payload).encode(), {"Content-Type": "application/json"}, head=head)

        def error(self, status: int, code: str, message: str, head: bool, headers: dict | None = None) -> None:
            """An error as the Hub sends it: the code huggingface_hub maps to its exception
            (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError)."""
            self.send(
                status,
                json.dumps({"error": message}).encode(),
                {
                    "Content-Type": "application/json",
                    "X-Error-Code": code,
                    "X-Error-Message": message,
                    **(headers or {}),
                },
                head=head,
            )

        def handle_request(self, head: bool) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            # Split before unquoting: a revision comes quoted whole (refs%2Fpr%2F1).
            parts = [unquote(part) for part in url.path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo = "/".join(parts[2:4])
                rest = parts[4:]
                if not rest:
                    return self.model_info(repo, "main", query, head)
                if rest[0] == "revision" and len(rest) == 2:
                    return self.model_info(repo, rest[1], query, head)
                if rest[0] == "tree" and len(rest) >= 2:
                    return self.tree(repo, rest[1], "/".join(rest[2:]), query, head)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve_file(
                    repo="/".join(parts[:2]), revision=parts[3], path="/".join(parts[4:]), head=head
                )
            return self.error(404, "RepoNotFound", f"{url.path} not found", head)

        def repository(self, repo: str, revision: str, head: bool) -> tuple[list[Blob], str] | None:
            blobs = repo_blobs(root, repo)
            if not blobs:
                self.error(404, "RepoNotFound", f"Repository not found: {repo}", head)
                return None
            commit = hub.resolve(repo, revision, blobs)
            if commit is None:
                self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                return None
            return blobs, commit

        def model_info(self, repo: str, revision: str, query: dict, head: bool) -> None:
            found = self.repository(repo, revision, head)
            if found is None:
                return
            blobs, commit = found
            with_blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for blob in blobs:
                sibling: dict = {"rfilename": blob.path}
                if with_blobs:
                    sibling.update(size=blob.size, blobId=blob.oid)
                    if blob.lfs:
                        sibling["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": blob.pointer_size}
                siblings.append(sibling)
            self.json(
                {
                    "_id": commit[:24],
                    "id": repo,
                    "modelId": repo,
                    "author": repo.split("/")[0],
                    "sha": commit,
                    "private": False,
                    "gated": False,
                    "disabled": False,
                    "tags": [],
                    "siblings": siblings,
                },
                head,
            )

        def tree(self, repo: str, revision: str, path: str, query: dict, head: bool) -> None:
            found = self.repository(repo, revision, head)
            if found is None:
                return
            blobs, commit = found
            folders = folders_of(blobs)
            if path and path not in folders:
                return self.error(404, "EntryNotFound", f"{path} does not exist on {revision}", head)
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            prefix = f"{path}/" if path else ""

            def listed(name: str) -> bool:
                return name.startswith(prefix) and (recursive or "/" not in name[len(prefix) :])

            entries: list[dict] = [
                {
                    "type": "directory",
                    "oid": hashlib.sha1(f"{commit}\0{folder}".encode()).hexdigest(),
                    "size": 0,
                    "path": folder,
                }
                for folder in folders
                if listed(folder)
            ]
            entries.extend(tree_entry(blob) for blob in blobs if listed(blob.path))
            # One page from the cursor on; the next page's URL in a Link header, as the Hub.
            cursor_text = query.get("cursor", ["0"])[0]
            if not cursor_text.isdigit():
                return self.error(400, "BadRequest", f"invalid cursor {cursor_text!r}", head)
            cursor = int(cursor_text)
            page = entries[cursor : cursor + tree_page_size]
            headers = {"Content-Type": "application/json"}
            if cursor + tree_page_size < len(entries):
                following = {**{key: values[0] for key, values in query.items()}, "cursor": cursor + tree_page_size}
                host = self.headers.get("Host", "")
                headers["Link"] = f'<http://{host}{urlparse(self.path).path}?{urlencode(following)}>; rel="next"'
            self.send(200, json.dumps(page).encode(), headers, head=head)

        def resolve_file(self, repo: str, revision: str, path: str, head: bool) -> None:
            found = self.repository(repo, revision, head)
            if found is None:
                return
            blobs, commit = found
            blob = next((b for b in blobs if b.path == path), None)
            if blob is None:
                return self.error(
                    404, "EntryNotFound", f"{path} does not exist on {revision}", head, {"X-Repo-Commit": commit}
                )
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Repo-Commit": commit,
                "ETag": f'"{blob.sha256 if blob.lfs else blob.oid}"',
                "Accept-Ranges": "bytes",
            }
            if blob.lfs:
                headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
            start, end = 0, blob.size - 1
            status = 200
            ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
            if ranged and ranged.group(1):
                start = int(ranged.group(1))
                if ranged.group(2):
                    end = min(int(ranged.group(2)), blob.size - 1)
                if start >= blob.size:
                    headers["Content-Range"] = f"bytes */{blob.size}"
                    return self.send(416, b"", headers, head=head)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
            body = b""
            if not head:
                with (root / repo / path).open("rb") as file:
                    file.seek(start)
                    body = file.read(end + 1 - start)
            headers["Content-Length"] = str(end + 1 - start)
            if not head:
                hub.record(
                    {
                        "repo": repo,
                        "file": path,
                        "revision": revision,
                        "commit": commit,
                        "start": start,
                        "bytes": len(body),
                        "size": blob.size,
                    }
                )
            return self.send(status, body, headers, head=head)

        def do_HEAD(self):
            self.handle_request(head=True)

        def do_GET(self):
            self.handle_request(head=False)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--tree-page-size", type=int, default=TREE_PAGE_SIZE, help="entries per page of a tree")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.root, args.log, args.tree_page_size))
    print(f"fake Hugging Face Hub serving {args.root} on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

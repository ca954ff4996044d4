"""TEST DOUBLE of the Hugging Face Hub, for the local fleet (which has no internet).

Serves model repositories from a directory (`ROOT/<org>/<name>/<file>`) over plain
HTTP with the part of the Hub's API that `hf download` (huggingface_hub) uses: the
model info of a revision, the file tree, and file resolution with the headers the
client checks (X-Repo-Commit, ETag, Content-Length, ranges for resumption). It
counts file downloads per repository so a test can prove a model was fetched once.

    python fake_hf_hub.py --root DIR --host 10.99.0.254 --port 8765 --log requests.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


def repo_files(root: Path, repo: str) -> list[Path]:
    base = root / repo
    return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


def repo_sha(root: Path, repo: str) -> str:
    digest = hashlib.sha1()
    for path in repo_files(root, repo):
        digest.update(str(path.relative_to(root / repo)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def file_etag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_handler(root: Path, log_path: Path | None):
    lock = threading.Lock()

    def record(entry: dict) -> None:
        if log_path is None:
            return
        with lock, log_path.open("a") as log:
            log.write(json.dumps(entry) + "\n")

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

        def json(self, status: int, payload) -> None:
            self.send(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

        def not_found(self, what: str) -> None:
            self.send(
                404,
                json.dumps({"error": f"{what} not found"}).encode(),
                {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"},
            )

        def handle_request(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            parts = path.strip("/").split("/")
            # /api/models/{org}/{name}/revision/{rev} and /api/models/{org}/{name}/tree/{rev}[/{path}]
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo = "/".join(parts[2:4])
                files = repo_files(root, repo)
                if not files:
                    return self.not_found(repo)
                sha = repo_sha(root, repo)
                if parts[4] == "revision":
                    return self.json(
                        200,
                        {
                            "id": repo,
                            "modelId": repo,
                            "sha": sha,
                            "private": False,
                            "gated": False,
                            "siblings": [{"rfilename": str(p.relative_to(root / repo))} for p in files],
                        },
                    )
                return self.json(
                    200,
                    [
                        {
                            "type": "file",
                            "path": str(p.relative_to(root / repo)),
                            "size": p.stat().st_size,
                            "oid": file_etag(p),
                        }
                        for p in files
                    ],
                )
            # /{org}/{name}/resolve/{rev}/{file...}
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = "/".join(parts[:2])
                target = root / repo / "/".join(parts[4:])
                if not target.is_file():
                    return self.not_found(path)
                data = target.read_bytes()
                headers = {
                    "Content-Type": "application/octet-stream",
                    "X-Repo-Commit": repo_sha(root, repo),
                    "ETag": f'"{file_etag(target)}"',
                    "Accept-Ranges": "bytes",
                }
                start = 0
                range_header = self.headers.get("Range", "")
                if range_header.startswith("bytes="):
                    start = int(range_header[6:].split("-")[0] or 0)
                body = data[start:]
                headers["Content-Length"] = str(len(body))
                if not head:
                    record({"repo": repo, "file": "/".join(parts[4:]), "bytes": len(body)})
                return self.send(206 if start else 200, body, headers, head=head)
            return self.not_found(path)

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
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.root, args.log))
    print(f"fake Hugging Face Hub serving {args.root} on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

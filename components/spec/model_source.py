"""The model source: what the nodes download (model, modelRevision, hfEndpoint) and the
name clients ask for (servedModelName). The id, revision and name reach a shell on the
nodes; the hub URL is written to an env file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.spec.reader import Reader, injection_note

_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
# Hugging Face revisions: branch and tag names or a commit; also a directory name on the cache.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){0,3}$")
_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?(/[A-Za-z0-9._/-]*)?$")


@dataclass(frozen=True)
class ModelSource:
    """What the nodes download and the name clients ask for."""

    model: str | None
    model_revision: str
    hf_endpoint: str | None
    served_model_name: str | None


def check_model_source(reader: Reader) -> ModelSource:
    """The model id, revision and served name reach a shell on the nodes; the hub URL is
    written to an env file."""
    model = reader.string("model")
    if model is not None and not _HF_REPO_ID.match(model):
        reader.fail(
            "model",
            "must be a Hugging Face repo id such as meta-llama/Llama-3.1-8B-Instruct" + injection_note(model),
        )

    model_revision = reader.string("modelRevision") or "main"
    if not _REVISION.match(model_revision) or ".." in model_revision:
        reader.fail(
            "modelRevision",
            "must be a branch, tag or commit of the model repo, such as main or a 40-character commit hash"
            + injection_note(model_revision),
        )

    hf_endpoint = reader.string("hfEndpoint")
    if hf_endpoint is not None and not _URL.match(hf_endpoint):
        reader.fail(
            "hfEndpoint",
            "must be an http(s) URL such as https://hf-mirror.example.com (letters, digits and . - : / only)",
        )

    served_model_name = reader.string("servedModelName")
    if served_model_name is not None and not _SERVED_NAME.match(served_model_name):
        reader.fail(
            "servedModelName",
            "may only hold letters, digits and . _ : / -" + injection_note(served_model_name),
        )
    return ModelSource(model, model_revision, hf_endpoint, served_model_name)

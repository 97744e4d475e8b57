"""The registry sections: models (registered or imported from GGUF), datasets, rewards."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from posttrain_sdk.client.sections import ProjectRef, _Registry
from posttrain_sdk.errors import APIError, FieldError, PosttrainError
from posttrain_sdk.types import Dataset, Model, Reward

IMPORT_POLL_S = 2.0  # how often a GGUF import is asked whether it ended
DATASET_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class Models(_Registry[Model]):
    section, path, kind = "model", "/api/models/", Model

    def register(self, name: str, path: str, *, description: str = "", project: ProjectRef | None = None) -> Model:
        """Register a Hugging Face model folder that the server can read (its path on the server)."""
        body = {"name": name, "path": str(path), "description": description, **self.client.creating_in(project)}
        return Model.from_api(self.client.post("/api/models/", body))

    def import_gguf(
        self,
        file: str | Path,
        *,
        name: str = "",
        description: str = "",
        project: ProjectRef | None = None,
        server_path: bool = False,
        wait: bool = True,
        poll_s: float = IMPORT_POLL_S,
    ) -> dict[str, Any]:
        """Import a GGUF file (uploaded, or `server_path`: a file the server reads, with an admin's grant): the server
        converts it into an ordinary model folder on its user-code worker, in the sandbox. Returns the import
        (`state`, `error`, `model`), once it ended when `wait`; a failed import raises APIError naming why."""
        fields = {"name": name, "description": description, **self.client.creating_in(project)}
        if server_path:
            record = self.client.post("/api/models/import-gguf/", {**fields, "path": str(file)})
        else:
            local = Path(file)
            if not local.is_file():
                raise PosttrainError(f"file: no such file {local}")
            with local.open("rb") as f:
                response = self.client.request(
                    "POST", "/api/models/import-gguf/", data=fields, files={"file": (local.name, f)}
                )
            record = response.json()
        while wait and record["state"] not in ("done", "failed"):
            time.sleep(poll_s)
            record = self.client.get(record["url"])
        if record["state"] == "failed":
            raise APIError(422, [FieldError("file", record.get("error") or "the import failed")], body=record)
        return record


class Datasets(_Registry[Dataset]):
    section, path, kind = "dataset", "/api/datasets/", Dataset

    def push(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        prompt_field: str = "prompt",
        label_field: str | None = "label",
        format: str | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Dataset:
        """Upload a JSONL, CSV or Parquet file; the same content again (in the same project) returns the existing
        dataset."""
        path = Path(path)
        if not path.is_file():
            raise PosttrainError(f"file: no such file {path}")
        fields = {
            "name": name or path.stem,
            "prompt_field": prompt_field,
            "label_field": label_field or "",
            "description": description,
            **self.client.creating_in(project),
        }
        guessed = format or DATASET_SUFFIXES.get(path.suffix.lower())
        if guessed:
            fields["format"] = guessed
        with path.open("rb") as f:
            response = self.client.request("POST", "/api/datasets/", data=fields, files={"file": (path.name, f)})
        return Dataset.from_api(response.json())


class Rewards(_Registry[Reward]):
    section, path, kind = "reward", "/api/rewards/", Reward

    def push(
        self,
        name: str,
        path: str | Path | None = None,
        *,
        kind: str | None = None,
        spec: dict[str, Any] | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Reward:
        """A Python reward file (`reward_func` or verl's `compute_score`, checked in the server's
        sandbox) or a spec: `rewards.push("exact", spec={"type": "exact_match"})` is a builtin."""
        body: dict[str, Any] = {
            "name": name,
            "description": description,
            "spec": spec or {},
            **self.client.creating_in(project),
        }
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise PosttrainError(f"file: no such file {path}")
            body["kind"] = kind or "python"
            body["source"] = path.read_text(encoding="utf-8")
        else:
            body["kind"] = kind or "builtin"
        return Reward.from_api(self.client.post("/api/rewards/", body))

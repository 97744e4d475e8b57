"""The experiments section: experiments from registry names or ids, or from a YAML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from posttrain_sdk.client.sections import ProjectRef, _Section
from posttrain_sdk.errors import PosttrainError
from posttrain_sdk.types import Experiment


class Experiments(_Section):
    def create(
        self,
        name: str,
        *,
        model: str | int,
        dataset: str | int,
        rewards: list[Any],
        config: dict[str, Any] | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Experiment:
        """An experiment from registry names or ids (names are looked up in `project`, else the client's);
        `rewards` items are a name/id or `{"reward": name_or_id, "weight": w}`. The config is checked by the
        engine's schema."""
        resolved = []
        for i, item in enumerate(rewards or []):
            reward, weight = (item.get("reward"), item.get("weight", 1.0)) if isinstance(item, dict) else (item, 1.0)
            if reward is None:
                raise PosttrainError(f"rewards[{i}].reward: required")
            resolved.append({"reward": self.client.rewards.get(reward, project=project).id, "weight": weight})
        body = {
            "name": name,
            "description": description,
            "model": self.client.models.get(model, project=project).id,
            "dataset": self.client.datasets.get(dataset, project=project).id,
            "rewards": resolved,
            "config": config or {},
            **self.client.creating_in(project),
        }
        return Experiment.from_api(self.client.post("/api/experiments/", body))

    def create_from_yaml(self, path: str | Path) -> Experiment:
        """`name`, `model`, `dataset`, `rewards` (registry names or ids), optional `description` and `project`
        (it wins over the client's), and `config`: the engine run config without model.path, data and rewards."""
        path = Path(path)
        if not path.is_file():
            raise PosttrainError(f"file: no such file {path}")
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise PosttrainError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        if not isinstance(spec, dict):
            raise PosttrainError(f"{path}: must be a mapping with name, model, dataset, rewards and config")
        missing = [key for key in ("name", "model", "dataset", "rewards") if key not in spec]
        if missing:
            raise PosttrainError(f"{path}: {missing[0]}: required")
        unknown = sorted(set(spec) - {"name", "description", "project", "model", "dataset", "rewards", "config"})
        if unknown:
            raise PosttrainError(f"{path}: {unknown[0]}: unknown key (engine settings go under `config:`)")
        return self.create(
            spec["name"],
            model=spec["model"],
            dataset=spec["dataset"],
            rewards=spec["rewards"] if isinstance(spec["rewards"], list) else [spec["rewards"]],
            config=spec.get("config") or {},
            description=spec.get("description") or "",
            project=spec.get("project"),
        )

    def list(self) -> list[Experiment]:
        return [Experiment.from_api(item) for item in self.client.pages("/api/experiments/")]

    def get(self, experiment_id: int) -> Experiment:
        return Experiment.from_api(self.client.get(f"/api/experiments/{int(experiment_id)}/"))

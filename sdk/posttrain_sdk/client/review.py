"""The review section: campaigns and their labels' exports."""

from __future__ import annotations

from pathlib import Path

from posttrain_sdk.client.responses import _download
from posttrain_sdk.client.sections import _Section
from posttrain_sdk.types import Campaign


class Review(_Section):
    def campaigns(self, state: str | None = None) -> list[Campaign]:
        return [Campaign.from_api(item) for item in self.client.pages("/api/review/campaigns/", state=state)]

    def export(
        self,
        campaign: int,
        path: str | Path,
        *,
        format: str = "trl",
        question: str | None = None,
    ) -> Path:
        """The campaign's labels: `trl` / `openai` preference pairs, `prm` step labels, `ratings_jsonl`,
        `ratings_csv`."""
        params = {"format": format, **({"question": question} if question else {})}
        return _download(self.client, f"/api/review/campaigns/{int(campaign)}/export/", params, Path(path))

"""Moving models from one app to another in migrations (SeparateDatabaseAndState, then a table rename): the
models' content types go with them, and so do the permissions that point at those content types."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Migrate = Callable[[Any, Any], None]


def content_type_moves(models: Sequence[str], source: str, target: str) -> tuple[Migrate, Migrate]:
    """RunPython's forward and backward functions: each of `models` (lower-case names) from app `source` to app
    `target`, and back. A content type the target already has (made by an earlier `migrate`) is left as it is."""

    def move(apps: Any, from_app: str, to_app: str) -> None:
        content_type = apps.get_model("contenttypes", "ContentType")
        for model in models:
            if not content_type.objects.filter(app_label=to_app, model=model).exists():
                content_type.objects.filter(app_label=from_app, model=model).update(app_label=to_app)

    return (
        lambda apps, schema_editor: move(apps, source, target),
        lambda apps, schema_editor: move(apps, target, source),
    )

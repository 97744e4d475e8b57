"""The review services' errors, at their former import path: they are the platform's one family now,
posttrain.core.errors, which new code imports."""

from posttrain.core.errors import ItemUnavailable, NotAssigned

__all__ = ["ItemUnavailable", "NotAssigned"]

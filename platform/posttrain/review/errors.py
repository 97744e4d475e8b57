"""Errors of the review services, in the runs app's error family so the API answers them the same way:

InvalidInput (posttrain.runs.errors)       400  {"errors": [{"loc": "questions[0].max", "msg": "..."}]}
IllegalTransition (posttrain.runs.errors)  409  {"detail": "...", "state": "<campaign state>"}
ItemUnavailable                            409  {"detail": "..."}: another annotator holds the item,
                                                it has all its judgements, or you judged it already
NotAssigned                                404  the campaign is not in the user's queue
"""

from __future__ import annotations

from posttrain.runs.errors import RunsError


class ItemUnavailable(RunsError):
    status_code = 409


class NotAssigned(RunsError):
    """Annotators learn nothing about campaigns they are not assigned to: the same answer as a wrong id."""

    status_code = 404

    def __init__(self) -> None:
        super().__init__("Not found.")

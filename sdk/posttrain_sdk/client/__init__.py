"""The REST API of a Posttrain server, typed: registry, experiments, runs, review exports.

    import posttrain_sdk as posttrain

    client = posttrain.Client()                       # the server and token `posttrain login` stored
    client = posttrain.Client(project="vision")       # lists show one project; creates go into it
    dataset = client.datasets.push("prompts.jsonl", name="addition")
    run = client.runs.launch(experiment_id, seed=1)
    for message in client.runs.follow(run.id):        # live: metrics, state, end
        ...

Every refusal raises APIError (AuthError, NotFound, Conflict) whose `errors` name the field.

The project: `Client(project=...)` (a name or id), else POSTTRAIN_PROJECT, else the default stored for the
server by `posttrain projects use`; `project=""` chooses none. Without one, lists show every project you read
and creates go into the one project you can create in (the server asks which when there are several).

Where things are: `core.py` the `Client` (requests, pagination, the project chosen); `sections.py` what the
sections share; `projects.py`, `registry.py` (models, datasets, rewards), `experiments.py`, `runs.py` and
`review.py` one section each; `responses.py` refusals as APIError and downloads.
"""

from posttrain_sdk.client.core import DEFAULT_TIMEOUT_S, PAGE_SIZE, PROJECT_ENV, Client
from posttrain_sdk.client.experiments import Experiments
from posttrain_sdk.client.projects import Projects
from posttrain_sdk.client.registry import DATASET_SUFFIXES, IMPORT_POLL_S, Datasets, Models, Rewards
from posttrain_sdk.client.review import Review
from posttrain_sdk.client.runs import AMBIGUOUS_SHOWN, RECONNECT_DELAY_S, Runs
from posttrain_sdk.client.sections import ProjectRef

__all__ = [
    "AMBIGUOUS_SHOWN",
    "DATASET_SUFFIXES",
    "DEFAULT_TIMEOUT_S",
    "IMPORT_POLL_S",
    "PAGE_SIZE",
    "PROJECT_ENV",
    "RECONNECT_DELAY_S",
    "Client",
    "Datasets",
    "Experiments",
    "Models",
    "ProjectRef",
    "Projects",
    "Review",
    "Rewards",
    "Runs",
]

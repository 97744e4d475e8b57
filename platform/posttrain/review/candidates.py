"""The rollouts a campaign's rule can pick, read in DuckDB with a limit (docs/ROLLOUTS.md, "Campaign sampling").

A campaign over a long run must not bring every rollout into Python: the rule's score is computed in the
query, and DuckDB keeps only the best few of each step (`min_by(…, key, n)`, a bounded heap per step
whatever its rows), so the web process (or the worker that builds a large campaign) receives about k
candidates per step. The steps are read STEPS_PER_QUERY at a time, and each batch holds whole steps, so
posttrain.review.sampling's `select` picks from a batch alone and the caller can stop as soon as it has
more items than a campaign may hold.

What DuckDB keeps is what `select` picks from, so the rules keep their meaning (sampling.py):
  the reward, component and judge rules  the k best by the rule's score, ties by index (select's own order)
  random, alerts                         k by a seeded hash of (seed, run, step, index): the same seed picks
                                         the same items, another seed others
  one_per_group                          one response per group by that hash, then k groups by it
  pairs within a run                     per step the PAIR_GROUP_SLACK·k + 4 groups whose first pair ranks
                                         best (random: by the hash), each with its 2k + PAIR_SAMPLE_SLACK best
  pairs across two runs                  each run's best response to each prompt (at each step, or at its
                                         latest step), joined on the prompt, the k best pairs per step
Texts never leave DuckDB for selection: pairing compares MD5 digests of the prompts and responses (the
campaign's copies then read the texts of the picked rollouts alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from posttrain.review.sampling import Candidate, RolloutKey
from posttrain.telemetry import rollouts
from posttrain.telemetry.rollouts import Gap, StoredFile

STEPS_PER_QUERY = 64
PAIR_GROUP_SLACK = 2
PAIR_SAMPLE_SLACK = 16
# The columns the candidate queries read: a file that lacks one is a gap naming it.
COLUMNS = ("step", "index", "group", "reward", "components", "prompt", "response")
_RANDOM_RULES = frozenset({"random", "alerts", "one_per_group"})
_SMALLEST_FIRST = frozenset({"lowest_reward", "near_boundary"})
_FINITE_REWARD = "(CASE WHEN isfinite(reward) THEN reward END)"
_KEY_STEP = 1 << 32

Judge = dict[RolloutKey, float]


def _literal(text: str) -> str:
    """A SQL string literal (component names and seeds are inlined: one parameter per query, its files)."""
    return "'" + text.replace("'", "''") + "'"


# --- the rule in SQL -------------------------------------------------------------------------------


def _component(name: str) -> str:
    """A reward component's value as a finite DOUBLE; NULL when the row lacks it or it is no number."""
    path = _literal('$."' + name.replace("\\", "\\\\").replace('"', '\\"') + '"')
    value = (
        f"(CASE WHEN json_type(components, {path}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
        f"THEN CAST(json_extract(components, {path}) AS DOUBLE) END)"
    )
    return f"(CASE WHEN isfinite({value}) THEN {value} END)"


def score_sql(source: dict[str, Any]) -> str:
    """The rule's score of a row (sampling.sample_score); NULL where it cannot score the row."""
    rule = source["rule"]
    if rule in _RANDOM_RULES:
        return "0.0"
    if rule in ("lowest_reward", "highest_reward"):
        return _FINITE_REWARD
    if rule == "near_boundary":
        return f"abs({_FINITE_REWARD} - {float(source.get('boundary', 0.0))!r})"
    if rule == "reward_vs_judge":
        return f"abs({_FINITE_REWARD} - judge_score)"
    values = [_component(name) for name in source["components"]]
    if rule == "component_disagreement":
        missing = " OR ".join(f"{v} IS NULL" for v in values)
        listed = ", ".join(values)
        return f"(CASE WHEN {missing} THEN NULL ELSE greatest({listed}) - least({listed}) END)"
    return f"abs({_FINITE_REWARD} - {values[0]})"  # reward_vs_component


def _seeded(source: dict[str, Any], run_id: str, *parts: str) -> str:
    """A seeded hash of the SQL `parts` (the order of a random rule): md5, the same in every DuckDB."""
    prefix = _literal(f"{source['seed']}:{run_id}:")
    joined = ", ':', ".join(parts)
    return f"md5_number(concat({prefix}, {joined}))"


def _key(source: dict[str, Any], run_id: str) -> str:
    """The order a step's rows are kept in, smallest first: the rule's order with ties by index, or the hash."""
    if source["rule"] in _RANDOM_RULES:
        return _seeded(source, run_id, "step", '"index"')
    sign = "" if source["rule"] in _SMALLEST_FIRST else "-"
    return f"{{'s': {sign}score, 'i': \"index\"}}"


def _scored(source: dict[str, Any], files: str = "$1") -> str:
    """The rows of the files (the query's parameter `files`) with their score, those it cannot score left out."""
    judge = ' JOIN judge USING (step, "index")' if source["rule"] == "reward_vs_judge" else ""
    scored = f"SELECT *, {score_sql(source)} AS score FROM read_parquet({files}){judge}"
    return f"(SELECT * FROM ({scored}) WHERE score IS NOT NULL)"


def _candidate_struct(source: dict[str, Any], digests: bool = False) -> str:
    fields = [
        "'step': step",
        "'index': \"index\"",
        "'group': \"group\"",
        f"'reward': {_FINITE_REWARD}",
        f"'components': CASE WHEN length(components) <= {rollouts.JSON_CHARS} THEN components END",
        "'score': score",
    ]
    if source["rule"] == "reward_vs_judge":
        fields.append("'judge': judge_score")
    if digests:
        fields += ["'prompt': md5(prompt)", "'response': md5(response)"]
    return "{" + ", ".join(fields) + "}"


def _unnested(inner: str) -> str:
    """The rows each group kept, one candidate a row, in (step, index) order (the same every time)."""
    return f'SELECT * FROM (SELECT unnest(picked, recursive := true) FROM ({inner})) ORDER BY step, "index"'


# --- the queries, one per kind of rule ---------------------------------------------------------------


def best_per_step_sql(source: dict[str, Any], run_id: str, per_step: int) -> str:
    """The `per_step` best rows of each step by the rule (random: by the seeded hash)."""
    inner = (
        f"SELECT step, min_by({_candidate_struct(source)}, {_key(source, run_id)}, {int(per_step)}) AS picked "
        f"FROM {_scored(source)} GROUP BY step"
    )
    return _unnested(inner)


def one_per_group_sql(source: dict[str, Any], run_id: str) -> str:
    """One row of each prompt group by the seeded hash, and k groups of each step by it."""
    per_group = (
        f'SELECT step, "group", min_by({_candidate_struct(source)}, {_key(source, run_id)}) AS pick '
        f'FROM {_scored(source)} GROUP BY step, "group"'
    )
    group_key = _seeded(source, run_id, "step", "'g'", '"group"')
    inner = f"SELECT step, min_by(pick, {group_key}, {int(source['k'])}) AS picked FROM ({per_group}) GROUP BY step"
    return _unnested(inner)


def named_sql(source: dict[str, Any]) -> str:
    """Exactly the rollouts the second parameter names (step · 2³² + index): an alert's own examples."""
    named = (
        f"SELECT {_candidate_struct(source)} AS picked FROM {_scored(source)} "
        f'WHERE list_contains($2, step::BIGINT * {_KEY_STEP} + "index")'
    )
    return f'SELECT * FROM (SELECT unnest(picked) FROM ({named})) ORDER BY step, "index"'


def _group_key(source: dict[str, Any], run_id: str) -> str:
    """The rank of a prompt group's first pair (sampling._pair_score of its two best), ties by group."""
    rule = source["rule"]
    if rule == "random":
        return _seeded(source, run_id, "step", "'g'", '"group"')
    key = _key(source, run_id)
    if rule == "lowest_reward":
        first_pair = f"list_avg(min_by(score, {key}, 2))"
    elif rule == "highest_reward":
        first_pair = f"-list_avg(min_by(score, {key}, 2))"
    else:  # the disagreement rules: a pair scores its larger sample score
        first_pair = "-max(score)"
    return f"{{'m': {first_pair}, 'g': \"group\"}}"


def pairs_within_run_sql(source: dict[str, Any], run_id: str) -> str:
    """Per step the groups whose first pair ranks best, each with its best responses (texts as digests)."""
    k = int(source["k"])
    groups = (
        f'SELECT step, "group", {_group_key(source, run_id)} AS gkey FROM {_scored(source)} '
        'GROUP BY step, "group" HAVING count(*) >= 2'
    )
    kept = PAIR_GROUP_SLACK * k + 4
    chosen = f'SELECT step, unnest(min_by("group", gkey, {kept})) AS "group" FROM ({groups}) GROUP BY step'
    inner = (
        f'SELECT step, "group", min_by({_candidate_struct(source, digests=True)}, {_key(source, run_id)}, '
        f'{2 * k + PAIR_SAMPLE_SLACK}) AS picked FROM {_scored(source)} JOIN ({chosen}) USING (step, "group") '
        'GROUP BY step, "group"'
    )
    return _unnested(inner)


def _pair_key(source: dict[str, Any]) -> str:
    rule = source["rule"]
    if rule == "random":
        return _seeded(source, "pair", "a.bucket", 'a.best."index"', 'b.best."index"', "a.best.step", "b.best.step")
    if rule == "lowest_reward":
        return "(a.best.score + b.best.score) / 2"
    if rule == "highest_reward":
        return "-(a.best.score + b.best.score) / 2"
    return "-greatest(a.best.score, b.best.score)"


def pairs_across_runs_sql(source: dict[str, Any]) -> str:
    """Each run's best response to each prompt (per step, or at that run's latest step with it), paired
    on the prompt where the two responses differ, the k best pairs per step ($1: the first run's files,
    $2: the second's)."""
    latest = source.get("pair_steps") == "latest"
    first, second = source["runs"]

    def best(run_id: str, files: str) -> str:
        key = _key(source, run_id)
        order = f"{{'st': -step, 'k': {key}}}" if latest else key
        bucket = "0" if latest else "step"
        return (
            f"SELECT {bucket} AS bucket, md5(prompt) AS p, min_by({_candidate_struct(source, digests=True)}, {order}) "
            f"AS best FROM {_scored(source, files)} GROUP BY bucket, p"
        )

    ties = 'a.best.step, a.best."index", b.best.step, b.best."index"'
    return (
        f"SELECT a.bucket AS bucket, a.best AS a, b.best AS b FROM ({best(first, '$1')}) a JOIN ({best(second, '$2')}) b "
        "ON a.bucket = b.bucket AND a.p = b.p WHERE a.best.response <> b.best.response "
        f"QUALIFY row_number() OVER (PARTITION BY a.bucket ORDER BY {_pair_key(source)}, {ties}) <= {int(source['k'])} "
        f"ORDER BY a.bucket, {ties}"
    )


# --- the batches -------------------------------------------------------------------------------------


def _chunks(files: list[StoredFile]) -> Iterator[list[StoredFile]]:
    """The files STEPS_PER_QUERY steps at a time, in step order (a step's parts together)."""
    steps = sorted({f.step for f in files})
    for start in range(0, len(steps), STEPS_PER_QUERY):
        chosen = set(steps[start : start + STEPS_PER_QUERY])
        yield [f for f in files if f.step in chosen]


def _judge_table(judge: Judge, run_id: str) -> Any:
    """The judge run's scores of the run's rollouts, as the table the query joins (`judge`)."""
    import pyarrow as pa

    mine = [(step, index, score) for (run, step, index), score in judge.items() if run == run_id]
    return pa.table(
        {
            "step": pa.array([m[0] for m in mine], pa.int32()),
            "index": pa.array([m[1] for m in mine], pa.int32()),
            "judge_score": pa.array([m[2] for m in mine], pa.float64()),
        }
    )


def _read(
    sql: str,
    files: list[StoredFile],
    params: Callable[[list[StoredFile]], list[Any] | None],
    gaps: list[Gap],
    tables: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The query's rows over `files` (`params` of the readable part, None: nothing to read), the files
    DuckDB cannot read left out, each a gap."""

    def query(part: list[StoredFile]) -> Iterator[dict[str, Any]]:
        values = params(part)
        return iter(()) if values is None else rollouts.stream(sql, values, tables)

    return list(rollouts.readable_stream(files, query, COLUMNS, gaps))


def _locations(part: list[StoredFile]) -> list[Any]:
    return [[f.location for f in part]]


def _to_candidate(run_id: str, row: dict[str, Any]) -> Candidate:
    components = row.get("components")
    return Candidate(
        run_id=run_id,
        step=row["step"],
        index=row["index"],
        group=row["group"],
        reward=row["reward"],
        components=rollouts.json_object(components) if isinstance(components, str) else {},
        prompt=row.get("prompt") or "",
        response=row.get("response") or "",
        judge=row.get("judge"),
    )


def candidate_batches(source: dict[str, Any], kind: str, judge: Judge, gaps: list[Gap]) -> Iterator[list[Candidate]]:
    """The source's candidates in batches of whole steps (whole buckets of `select`), in the order `select`
    meets them (run, then step); the files DuckDB cannot read, or the store lacks, are added to `gaps`."""
    runs: list[str] = sorted(source["runs"]) if kind == "single" else list(source["runs"])
    steps, step_range = source["steps"], source["step_range"]
    if source["rule"] == "alerts":
        steps = sorted({alert["step"] for alert in source["alerts"]})
    files = {
        run_id: rollouts.present_files(run_id, steps, None if step_range is None else tuple(step_range), gaps)
        for run_id in runs
    }
    if kind != "single" and len(runs) == 2:
        yield from _pairs_across(source, files, gaps)
        return
    for run_id in runs:
        tables = {"judge": _judge_table(judge, run_id)} if source["rule"] == "reward_vs_judge" else None
        for chunk in _chunks(files[run_id]):
            yield [_to_candidate(run_id, row) for row in _run_chunk(source, kind, run_id, chunk, gaps, tables)]


def _run_chunk(
    source: dict[str, Any],
    kind: str,
    run_id: str,
    chunk: list[StoredFile],
    gaps: list[Gap],
    tables: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    if kind != "single":
        return _read(pairs_within_run_sql(source, run_id), chunk, _locations, gaps, tables)
    if source["rule"] == "one_per_group":
        return _read(one_per_group_sql(source, run_id), chunk, _locations, gaps, tables)
    if source["rule"] != "alerts":
        return _read(best_per_step_sql(source, run_id, source["k"]), chunk, _locations, gaps, tables)
    # The alerts rule: an alert's own examples where it names them, k of the step at random otherwise.
    named: dict[int, set[int] | None] = {}
    for alert in source["alerts"]:
        if alert["run"] != run_id:
            continue
        if alert["indices"] is None:
            named[alert["step"]] = None
        elif named.get(alert["step"], set()) is not None:
            named[alert["step"]] = (named.get(alert["step"]) or set()) | set(alert["indices"])
    at_random = [f for f in chunk if f.step in named and named[f.step] is None]
    examples = [f for f in chunk if named.get(f.step)]
    keys = sorted(step * _KEY_STEP + index for step, indices in named.items() if indices for index in indices)
    return [
        *_read(best_per_step_sql(source, run_id, source["k"]), at_random, _locations, gaps, tables),
        *_read(named_sql(source), examples, lambda part: [*_locations(part), keys], gaps, tables),
    ]


def _pairs_across(
    source: dict[str, Any], files: dict[str, list[StoredFile]], gaps: list[Gap]
) -> Iterator[list[Candidate]]:
    """Pairs across the two runs: a batch per chunk of steps ("same"), or one batch ("latest")."""
    first, second = source["runs"]
    both = sorted([*files[first], *files[second]], key=lambda f: (f.step, f.run_id, f.part))
    chunks = [both] if source.get("pair_steps") == "latest" else list(_chunks(both))
    sql = pairs_across_runs_sql(source)

    def params(part: list[StoredFile]) -> list[Any] | None:
        mine = [[f.location for f in part if f.run_id == run_id] for run_id in (first, second)]
        return None if not mine[0] or not mine[1] else mine

    for chunk in chunks:
        batch: list[Candidate] = []
        for row in _read(sql, chunk, params, gaps):
            batch += [_to_candidate(first, row["a"]), _to_candidate(second, row["b"])]
        yield batch

"""The metric catalogue: every metric the engine logs, with its unit, the run page's panel that draws it,
which way is better and whether it is a headline metric. The one place metric names are described: the
run page draws its panels from it, compare opens with its headline metrics and reads which side is
best, the diagnostics rules check their metrics against it, and rl_engine/README.md's metric table is
generated from it (`python scripts/metric_table.py --write`). Standard library only, so the engine and the
web process (which never imports torch) both read it; see docs/ARCHITECTURE.md, "Metric names".

A name is a metric's name (`kl/mean`) or a pattern whose `<placeholder>`s stand for one name part each
(`reward/<component>`: `reward/exact_match`, not `reward/format/ok`). A metric with an exact entry takes
it; otherwise the first pattern that matches, in catalogue order. Metrics nothing matches are shown
only on demand.

A panel is one chart with one y axis, so every metric on it has the panel's unit (checked on import):
adding a panel is one `Panel(...)` entry listing its metrics. Panels of one `group` are drawn together
under the group's title (`GROUPS`): the stability group puts side by side what says whether off-policy
training is holding (the rollout/trainer mismatch, importance weights, what the correction dropped,
entropy, clipping, gradient norm, staleness).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    higher_is_better: bool | None  # None: neither side is better (a counter, a setting, a spread)
    headline: bool = False  # among the first curves to look at (a fresh run page, compare's defaults)
    unit: str = ""  # a panel's metrics take the panel's
    panel: str | None = None  # set from the panel that lists the metric; None: shown on demand only

    @property
    def pattern(self) -> re.Pattern[str]:
        """The names this entry covers, as a regular expression (JavaScript's syntax too)."""
        parts = re.split(r"(<\w+>)", self.name)
        body = "".join("[^/]+" if re.fullmatch(r"<\w+>", part) else re.escape(part) for part in parts)
        return re.compile(f"^{body}$")

    @property
    def is_pattern(self) -> bool:
        return "<" in self.name


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    unit: str
    metrics: tuple[Metric, ...]
    stacked_bars: bool = False  # a breakdown of one total (time per phase), not curves
    group: str | None = None  # drawn with the other panels of its group (`GROUPS`), under its title


STABILITY = "stability"
GROUPS: dict[str, str] = {
    STABILITY: "Stability: rollout vs trainer mismatch, importance weights, entropy, clipping, staleness",
}

PANELS: tuple[Panel, ...] = (
    Panel(
        "reward",
        "Reward (mean and per component)",
        "reward",
        (
            Metric(
                "reward/mean",
                "Mean total reward of the step's samples (the weighted sum of the components)",
                True,
                headline=True,
            ),
            Metric("reward/task_mean", "Mean reward before shaping (overlong penalty)", True),
            Metric("reward/<component>", "Mean score of one reward component (its name in the run config)", True),
        ),
    ),
    Panel(
        "environments",
        "Reward per environment (a run that mixes environments)",
        "reward",
        (
            Metric(
                "env/<env>/reward/mean",
                "Mean total reward of the step's samples from one environment (the rows' `env` field)",
                True,
            ),
        ),
    ),
    Panel(
        "kl",
        "KL to the reference policy",
        "nats/token",
        (
            Metric("kl/mean", "KL of the policy to the reference model, per token", False, headline=True),
            Metric("policy/approx_kl", "KL between the policy before and after the update (PPO's trust region)", False),
        ),
    ),
    Panel(
        "entropy",
        "Policy entropy",
        "nats/token",
        (Metric("policy/entropy", "Entropy of the policy on the sampled responses", True, headline=True),),
        group=STABILITY,
    ),
    Panel(
        "clip",
        "Clip ratio",
        "fraction",
        (
            Metric("policy/clip_ratio", "Share of tokens whose probability ratio was clipped", False),
            Metric("policy/clip_ratio_high", "Share of tokens clipped at 1 + clip_high (positive advantage)", False),
            Metric("policy/clip_ratio_low", "Share of tokens clipped at 1 - clip_low (negative advantage)", False),
            Metric("critic/clip_ratio", "Share of value predictions clipped (PPO)", False),
        ),
        group=STABILITY,
    ),
    Panel(
        "grad_norm",
        "Gradient norm (before clipping)",
        "norm",
        (
            Metric("policy/grad_norm", "Policy gradient norm before clipping", False),
            Metric("critic/grad_norm", "Value gradient norm before clipping (PPO)", False),
        ),
        group=STABILITY,
    ),
    Panel(
        "staleness",
        "Staleness: updates between a sample's policy and the trainer's",
        "updates",
        (
            Metric(
                "staleness/mean", "Mean over the step's tokens of the updates since their policy (async mode)", False
            ),
            Metric(
                "staleness/max", "Most updates behind of any token of the step (at most backends.max_staleness)", False
            ),
            Metric(
                "rollout_corr/staleness_<stat>",
                "Policy versions between a trained row's rollout and the update (mean, max)",
                False,
            ),
            Metric(
                "staleness/in_flight_<stat>",
                "Updates that landed while a sample was generated: its newest token's version minus its oldest "
                "(mean, max over samples; above 0 only with partial rollout)",
                False,
            ),
            Metric(
                "staleness/in_queue_<stat>",
                "Updates since a sample's last token: the trainer's version minus its newest (mean, max over samples)",
                False,
            ),
            Metric(
                "staleness/dropped",
                "Samples left out of the update for a token older than backends.max_staleness (0: the bound held)",
                False,
            ),
        ),
        group=STABILITY,
    ),
    Panel(
        "staleness_share",
        "Staleness distribution (share of tokens per lag)",
        "fraction",
        (
            Metric(
                "staleness/share_<lag>", "Share of the step's tokens sampled <lag> updates behind the trainer", None
            ),
            Metric(
                "staleness/interrupted_fraction",
                "Share of samples a weight sync split into segments (partial rollout)",
                None,
            ),
        ),
        group=STABILITY,
    ),
    Panel(
        "length",
        "Response length (tokens)",
        "tokens",
        (
            Metric("response/length_mean", "Mean response length", False, headline=True),
            Metric("response/length_max", "Longest response of the step", False),
            Metric("response/length_min", "Shortest response of the step", None),
            Metric("eval/response/length_mean", "Mean response length on the held-out prompts (greedy)", False),
        ),
    ),
    Panel(
        "response_quality",
        "Response degeneration and gaming (fraction)",
        "fraction",
        (
            Metric(
                "response/repetition_rate",
                "Mean share of a response's token 4-grams that repeat an earlier one (loops)",
                False,
            ),
            Metric(
                "response/nonprintable_share",
                "Mean share of a response's characters that are not text (controls, broken bytes)",
                False,
            ),
            Metric(
                "response/normalized_surprisal",
                "Mean -log-prob of the sampled tokens over a uniform draw's (1 = writing noise)",
                None,
            ),
            Metric(
                "response/top_answer_group_share",
                "Share of the step's prompts that got its most common answer (one answer for every prompt: a "
                "format-only pattern)",
                False,
            ),
            Metric(
                "reward/group_all_equal_rate",
                "Share of prompts whose samples all scored the same (no learning signal in GRPO)",
                False,
            ),
        ),
    ),
    Panel(
        "filters",
        "Filtered out before training (samples per step)",
        "samples",
        (
            Metric(
                "filter/<name>/dropped",
                "Samples a rollout filter (gibberish, repetition, zero_advantage) kept out of the update",
                None,
            ),
        ),
    ),
    Panel(
        "truncation",
        "Truncated responses (rate)",
        "fraction",
        (Metric("response/truncated_rate", "Share of responses cut at max_new_tokens", False),),
    ),
    Panel(
        "throughput",
        "Throughput (tokens/s)",
        "tokens/s",
        (
            Metric("throughput/tokens_per_s", "Tokens generated per second of generation", True),
            Metric("throughput/train_tokens_per_s", "Tokens trained on per second of the update", True),
        ),
    ),
    Panel(
        "mfu",
        "Training model FLOPs utilisation (fraction of the device's peak)",
        "fraction",
        (
            Metric(
                "throughput/train_mfu",
                "Model FLOPs of the update (6N per token plus attention) per second, over the device's peak",
                True,
            ),
        ),
    ),
    Panel(
        "offpolicy",
        "Rollout engine vs trainer (log-prob gap, off-policy KL)",
        "nats/token",
        (
            Metric("kl/rollout_vs_policy", "Mean log-prob of the rollout engine minus the trainer's, per token", False),
            Metric(
                "rollout/logprob_diff_max", "Largest per-token log-prob gap between rollout engine and trainer", False
            ),
            Metric(
                "rollout/logprob_diff_mean", "Mean per-token log-prob gap between rollout engine and trainer", False
            ),
        ),
        group=STABILITY,
    ),
    Panel(
        "rollout_corr",
        "Rollout correction: trainer vs rollout engine (KL, log-perplexity gap)",
        "nats/token",
        (
            Metric("rollout_corr/kl", "k1 estimate of KL(rollout engine || trainer) on the sampled tokens", False),
            Metric("rollout_corr/k3_kl", "k3 estimate of the same KL (non-negative, lower variance)", False),
            Metric(
                "rollout_corr/log_ppl_abs_diff",
                "Mean per-sequence |log-perplexity of the trainer - of the rollout engine|",
                False,
            ),
        ),
        group=STABILITY,
    ),
    Panel(
        "rollout_corr_chi2",
        "Rollout correction: chi-squared divergence (token, sequence)",
        "chi2",
        (
            Metric("rollout_corr/chi2_token", "E[rho^2] - 1 over tokens, rho = trainer / rollout probability", False),
            Metric("rollout_corr/chi2_seq", "E[(prod rho)^2] - 1 over sequences", False),
        ),
        group=STABILITY,
    ),
    Panel(
        "rollout_corr_weights",
        "Rollout correction: importance weights (quantiles)",
        "ratio",
        (
            Metric(
                "rollout_corr/weight_<quantile>", "A quantile (min, p05, p50, p95, max) of the token ratio rho", None
            ),
            Metric("rollout_corr/weight_mean", "Mean of the weights the correction applied", None),
        ),
        group=STABILITY,
    ),
    Panel(
        "rollout_corr_dropped",
        "Rollout correction: masked and truncated (fraction)",
        "fraction",
        (
            Metric("rollout_corr/masked_fraction", "Share of tokens whose weight was masked to 0", False),
            Metric("rollout_corr/truncated_fraction", "Share of tokens whose weight was truncated", False),
            Metric("rollout_corr/seq_masked_fraction", "Share of sequences masked out whole", False),
        ),
        group=STABILITY,
    ),
    Panel(
        "memory",
        "Peak memory per role (GiB)",
        "GiB",
        (
            Metric("memory/<role>_gpu_peak_gb", "Peak GPU memory a role allocated (roles on a GPU only)", False),
            Metric(
                "memory/<role>_peak_gb", "Peak resident memory of a role's processes (driver, rollout, trainer)", False
            ),
        ),
    ),
    Panel(
        "loss",
        "Losses",
        "loss",
        (
            Metric("policy/loss", "Policy loss of the update", False),
            Metric("critic/loss", "Value loss of the update (PPO)", False),
        ),
    ),
    Panel(
        "eval",
        "Held-out evaluation",
        "reward",
        (
            Metric("eval/reward/mean", "Mean total reward on the held-out prompts (greedy decoding)", True),
            Metric("eval/reward/<component>", "Mean score of one reward component on the held-out prompts", True),
        ),
    ),
    Panel(
        "timing",
        "Where time goes (seconds per step, by phase)",
        "s",
        (Metric("timing/<phase>", "Seconds the step spent in one phase (generate, reward, train, ...)", False),),
        stacked_bars=True,
    ),
)

ON_DEMAND: tuple[Metric, ...] = (
    Metric("reward/std", "Standard deviation of the step's rewards", None, unit="reward"),
    Metric("reward/errors", "Samples whose reward failed (scored 0, the reason recorded)", False, unit="samples"),
    Metric(
        "response/compression_ratio",
        "Mean raw over DEFLATE-compressed bytes of responses of 64 bytes or more (a loop compresses well)",
        None,
        unit="ratio",
    ),
    Metric("reward/<component>/<log>", "An extra log a reward function returned", None, unit="as logged"),
    Metric("policy/ratio_max", "Largest probability ratio new/old policy in the update", False, unit="ratio"),
    Metric("policy/lr", "Learning rate of the step", None, unit="lr"),
    Metric("critic/lr", "Learning rate of the value model (PPO)", None, unit="lr"),
    Metric("critic/values_mean", "Mean value prediction over the trained tokens (PPO)", None, unit="return"),
    Metric(
        "returns/mean", "Mean return the value model is fitted to, over the trained tokens (PPO)", None, unit="return"
    ),
    Metric(
        "sequence/length_mean",
        "Mean prompt plus response length (other engines log it; Posttrain logs the response's)",
        None,
        unit="tokens",
    ),
    Metric("advantages/mean", "Mean advantage over the trained tokens", None, unit="advantage"),
    Metric("advantages/abs_mean", "Mean absolute advantage (how much signal the step carries)", None, unit="advantage"),
    Metric(
        "batch/kept_fraction", "Share of the batch trained on (dynamic sampling drops the rest)", True, unit="fraction"
    ),
    Metric(
        "rollout/overlapped_generate_s", "Generation hidden behind the update (asynchronous rollout)", None, unit="s"
    ),
    Metric("timing/step", "Seconds of the whole step", False, unit="s"),
    Metric("timing/eval", "Seconds of the held-out evaluation", False, unit="s"),
    Metric("timing/reward/<component>", "Seconds one reward component took", False, unit="s"),
    Metric("progress/samples", "Samples generated so far (an x axis)", None, unit="samples"),
    Metric("progress/tokens", "Tokens generated so far (an x axis)", None, unit="tokens"),
    Metric("progress/train_time_s", "Seconds of training so far (an x axis)", None, unit="s"),
    Metric("progress/epoch", "Passes over the training prompts so far (an x axis)", None, unit="epochs"),
    Metric("env/episode_errors", "Episodes the environment failed", False, unit="episodes"),
    Metric(
        "env/<log>", "A log of the run's environment (turns, tool calls, ...), mean per episode", None, unit="as logged"
    ),
    Metric("env/<env>/samples", "The step's samples from one environment (a mixed run)", None, unit="samples"),
    Metric("env/<env>/reward/std", "Standard deviation of one environment's rewards in the step", None, unit="reward"),
    Metric("eval/size", "Held-out prompts evaluated", None, unit="prompts"),
    Metric("eval/env/<log>", "An environment log on the held-out prompts", None, unit="as logged"),
)


def catalogue(panels: tuple[Panel, ...], on_demand: tuple[Metric, ...]) -> tuple[Metric, ...]:
    """Every entry, each panel's metrics with the panel's id and unit; ValueError for a metric whose unit
    is not its panel's, or a name listed twice."""
    metrics = []
    for panel in panels:
        for metric in panel.metrics:
            if metric.unit and metric.unit != panel.unit:
                raise ValueError(f"{metric.name} is in {metric.unit} but panel {panel.id!r} draws {panel.unit}")
            metrics.append(replace(metric, unit=panel.unit, panel=panel.id))
    metrics += on_demand
    names = [metric.name for metric in metrics]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"metrics listed twice: {', '.join(duplicates)}")
    return tuple(metrics)


METRICS: tuple[Metric, ...] = catalogue(PANELS, ON_DEMAND)
_EXACT = {metric.name: metric for metric in METRICS if not metric.is_pattern}
_PATTERNS = [metric for metric in METRICS if metric.is_pattern]
# A reward component's curve is `reward/<name>`: a component named like one of the engine's own reward curves
# (mean, std, errors, ...) would overwrite it, and the diagnostics read those. The run config refuses them.
RESERVED_REWARD_NAMES: frozenset[str] = frozenset(
    name.split("/", 1)[1] for name in _EXACT if name.startswith("reward/") and name.count("/") == 1
)


def lookup(name: str) -> Metric | None:
    """The entry that describes the metric `name`; None when the catalogue does not know it."""
    exact = _EXACT.get(name)
    if exact is not None:
        return exact
    return next((metric for metric in _PATTERNS if metric.pattern.match(name)), None)


def require(name: str) -> str:
    """`name`, after checking that the catalogue describes it (for code that reads a metric by name)."""
    if lookup(name) is None:
        raise KeyError(f"{name!r} is not in the metric catalogue (rl_engine/metric_catalogue.py)")
    return name


HEADLINE_METRICS: tuple[str, ...] = tuple(metric.name for metric in METRICS if metric.headline)


def catalogue_json() -> dict[str, Any]:
    """The catalogue as the browser reads it (embedded in the run and compare pages)."""
    return {
        "panels": [
            {"id": p.id, "title": p.title, "unit": p.unit, "stacked_bars": p.stacked_bars, "group": p.group}
            for p in PANELS
        ],
        "groups": GROUPS,
        "metrics": [
            {
                "name": m.name,
                "match": m.pattern.pattern,
                "exact": not m.is_pattern,
                "unit": m.unit,
                "panel": m.panel,
                "higher_is_better": m.higher_is_better,
                "headline": m.headline,
                "description": m.description,
            }
            for m in METRICS
        ],
    }


def markdown_table() -> str:
    """rl_engine/README.md's metric table (scripts/metric_table.py writes it there)."""
    titles = {panel.id: panel.title for panel in PANELS}
    better = {True: "higher", False: "lower", None: "—"}
    rows = ["| Metric | Unit | Panel | Better | What it is |", "|---|---|---|---|---|"]
    for m in METRICS:
        name = f"**`{m.name}`**" if m.headline else f"`{m.name}`"
        panel = titles[m.panel] if m.panel else "on demand"
        rows.append(f"| {name} | {m.unit} | {panel} | {better[m.higher_is_better]} | {m.description} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "GROUPS",
    "HEADLINE_METRICS",
    "METRICS",
    "ON_DEMAND",
    "PANELS",
    "STABILITY",
    "Metric",
    "Panel",
    "catalogue",
    "catalogue_json",
    "lookup",
    "markdown_table",
    "require",
]

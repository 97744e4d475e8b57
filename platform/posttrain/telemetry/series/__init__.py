"""Metric series at scale: a column store of each run's metrics (MetricBlock), the run summary, and
server-side downsampling for charts.

Writes. The newest metrics events of a run stay in their MetricRows (the "tail"). Once the tail holds
BLOCK_POINTS events, `append_metrics` seals them into one MetricBlock per metric, under the run's row
lock, in the ingesting transaction. When the run ends, `seal_tail` seals what is left, however short.
A block is written once and never updated. So a batch costs the same at step 10 as at step 10
million, and the run summary (`Run.summary`: per metric last, step, min, max, count) is updated from
the batch alone.

Reads. `read_series` makes three queries whatever the number of runs and metrics (four when it reads
overviews, below): each run's seal point, the blocks up to it, and the tail after it. It returns numpy
arrays in step order, which `runs_series` turns into chart payloads on one of the X_AXES. Non-finite
values are NaN in the store and `null` in the payload, so a chart shows a gap at that step.

Downsampling is M4 (Jugel et al., "M4: a visualization-oriented time series data aggregation",
VLDB 2014). The x range is cut into equal buckets, and each bucket keeps its first and last point,
its minimum and its maximum, in x order. A line chart drawn from those points has the same pixels as
one drawn from every point, when there are as many buckets as pixel columns. So every spike
survives, and so do the first and last points of the series. M4 is also a few vectorised numpy
passes per series, O(n). LTTB keeps one point per bucket, picked by triangle area. It can drop one
side of a noisy bucket's range, and it is a sequential loop. A bucket that holds non-finite values
also keeps its first non-finite point, so the gap shows at the right place instead of vanishing.

Overviews. A sealed block also keeps its overview: M4 of each run of OVERVIEW_BUCKET_POINTS (64)
consecutive points, at most 5 points of every 64. A chart whose M4 buckets span at least two overview
buckets (a run of 32 x max_points points or more) reads the overviews instead of every point: 16 times
fewer bytes, and M4 of the overviews keeps the same first and last points and the same minimum and
maximum of every overview bucket. A bucket edge may fall inside an overview bucket, so a point can land
one pixel column over; `points` still counts every stored point. The progress metric that places points
on the samples and tokens axes is always read whole (each point's x is its exact value at that step).
The choice is per run and metric, from the run summary's point count.

The modules, one concept each: `sealing` (the writes), `reading` (the reads), `m4` (the downsampling),
`charts` (chart payloads on an x axis), `export` (the raw event log) and `arrays` (the packed float64 format).
"""

from posttrain.telemetry.series.charts import (
    DEFAULT_MAX_POINTS,
    MAX_MAX_POINTS,
    MIN_MAX_POINTS,
    X_AXES,
    chart_series,
    overview_pairs,
    runs_series,
)
from posttrain.telemetry.series.export import EXPORT_FORMATS, export_filename
from posttrain.telemetry.series.m4 import m4_indices
from posttrain.telemetry.series.reading import Series, read_series
from posttrain.telemetry.series.sealing import (
    BLOCK_POINTS,
    OVERVIEW_BUCKET_POINTS,
    append_metrics,
    block_overview,
    seal_chunk,
    seal_tail,
    summary_with,
)

__all__ = [
    "BLOCK_POINTS",
    "DEFAULT_MAX_POINTS",
    "EXPORT_FORMATS",
    "MAX_MAX_POINTS",
    "MIN_MAX_POINTS",
    "OVERVIEW_BUCKET_POINTS",
    "X_AXES",
    "Series",
    "append_metrics",
    "block_overview",
    "chart_series",
    "export_filename",
    "m4_indices",
    "overview_pairs",
    "read_series",
    "runs_series",
    "seal_chunk",
    "seal_tail",
    "summary_with",
]

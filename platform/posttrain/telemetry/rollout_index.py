"""The rollout store's search index: for each rollout file, a small sidecar that says which words and
prompts it holds, so that a text search or a same-prompt query reads only the files that can match
(docs/ROLLOUTS.md, "Search index").

A sidecar lives beside the run's rollout folder, at `runs/<run>/rollout_index/<file name>.index`, and is
derived data: a Celery task builds it (`posttrain.telemetry.rollouts.rollout_index_update`) after the `samples`
event announced the file (the web process never reads a whole file to build one), and any file without a
current sidecar is simply scanned. It is plain UTF-8 text:

    posttrain-rollout-index 1 <the file's sha256> <the file's bytes>
    <prompt hash> <prompt hash> ...          (blake2b-64 of each distinct prompt, hex)
    <term>
    <term>
    ...

The terms are the distinct whitespace-free runs of the file's prompts, responses and labels, lower-cased
by DuckDB, the same `lower()` the search's scan applies. A search for `q` can only match a file if
every whitespace-free part of `lower(q)` is a substring of one of its terms, so a file whose sidecar
lacks a part is skipped, and the index never drops a match. A sidecar whose sha256 (or size) is not
the indexed file's is stale and ignored.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from posttrain_sdk import rollout_files

if TYPE_CHECKING:
    from posttrain.telemetry.rollouts import RunId, StoredFile

FOLDER = "rollout_index"  # beside the run's `rollouts` folder
SIDECARS_PER_READ = 32  # read (a bucket: fetched concurrently) together
SUFFIX = ".index"
MAGIC = "posttrain-rollout-index"
VERSION = "1"
# What separates terms: RE2's \s, the pattern both the build and the query split on.
WHITESPACE = r"\s+"
_PYTHON_WHITESPACE = re.compile(r"[\t\n\f\r ]+")  # RE2's \s, for text DuckDB already lower-cased


def prompt_hash(prompt: str) -> str:
    return hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).hexdigest()


def index_folder(run_id: RunId) -> str:
    """Beside the run's rollout folder (posttrain.telemetry.rollouts.rollout_folder) in the store."""
    return f"{str(settings.ROLLOUT_STORE).rstrip('/')}/runs/{run_id}/{FOLDER}"


def index_location(run_id: RunId, name: str) -> str:
    if rollout_files.parse_file_name(name) is None:
        raise ValueError(f"not a rollout file name: {name!r}")
    return f"{index_folder(run_id)}/{name}{SUFFIX}"


# --- building ---------------------------------------------------------------------------------


def index_text(con: Any, location: str, sha256: str, size: int) -> str:
    """The sidecar of the rollout file at `location` (read with the DuckDB connection `con`)."""
    cursor = con.cursor()
    try:
        prompts = cursor.execute("SELECT DISTINCT prompt FROM read_parquet(?)", [location]).fetchall()
        terms = cursor.execute(
            f"""
            SELECT DISTINCT term FROM (
                SELECT unnest(string_split_regex(lower(text), '{WHITESPACE}')) AS term FROM (
                    SELECT prompt AS text FROM read_parquet($1)
                    UNION ALL SELECT response FROM read_parquet($1)
                    UNION ALL SELECT label FROM read_parquet($1) WHERE label IS NOT NULL
                )
            ) WHERE term <> ''
            ORDER BY term
            """,
            [location],
        ).fetchall()
    finally:
        cursor.close()
    hashes = sorted({prompt_hash(p) for (p,) in prompts if p is not None})
    header = f"{MAGIC} {VERSION} {sha256} {size}"
    return "\n".join([header, " ".join(hashes), *(t for (t,) in terms)]) + "\n"


def file_digest(location: str) -> tuple[str, int]:
    """(sha256, bytes) of the file at `location`."""
    fs, path = rollout_files.split_url(location)
    with open(path, "rb") if fs is None else fs.open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest(), f.tell()


def write_sidecar(run_id: RunId, name: str, text: str) -> None:
    """The sidecar of the run's rollout file `name`, whole or not at all (as the rollout files are put)."""
    index_location(run_id, name)  # a rollout file's name, or ValueError
    rollout_files.put_object(index_folder(run_id), name + SUFFIX, text.encode("utf-8"))


def rollout_index_remove(run_id: RunId, names: Sequence[str]) -> None:
    """Deletes the sidecars of files the engine's retention removed."""
    sidecars = [name + SUFFIX for name in names if rollout_files.parse_file_name(name) is not None]
    rollout_files.remove_objects(index_folder(run_id), sidecars)


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sidecar:
    sha256: str
    size: int
    prompts: bytes  # b" <hash> <hash> ... "
    terms: bytes  # b"\n<term>\n<term>...": a part found in it lies within one term (parts hold no newline)

    def fits(self, f: StoredFile) -> bool:
        return self.sha256 == f.sha256 if f.sha256 else self.size == f.bytes

    def may_hold(self, parts: Sequence[bytes], prompt: str | None) -> bool:
        """UTF-8 bytes: a substring of valid UTF-8 is found in the bytes exactly when in the text."""
        if prompt is not None and f" {prompt} ".encode() not in self.prompts:
            return False
        return all(part in self.terms for part in parts)


def parse_sidecar(data: bytes) -> Sidecar | None:
    header, _, rest = data.partition(b"\n")
    fields = header.split(b" ")
    if len(fields) != 4 or fields[0] != MAGIC.encode() or fields[1] != VERSION.encode() or not fields[3].isdigit():
        return None
    prompts, _, terms = rest.partition(b"\n")
    return Sidecar(fields[2].decode("ascii", errors="replace"), int(fields[3]), b" " + prompts + b" ", b"\n" + terms)


def read_sidecars(files: Sequence[StoredFile]) -> list[Sidecar | None]:
    """Each file's sidecar (None where there is none or it cannot be read); a bucket's in one concurrent
    fetch (fsspec's `cat` of many paths)."""
    locations = [index_location(f.run_id, f.name) for f in files]
    fs, _ = rollout_files.split_url(locations[0]) if locations else (None, "")
    found: list[bytes | None]
    if fs is None:
        found = []
        for location in locations:
            try:
                found.append(Path(location.removeprefix("file://")).read_bytes())
            except OSError:
                found.append(None)
    else:
        paths = [rollout_files.split_url(location)[1] for location in locations]
        fetched = fs.cat(paths, on_error="omit")
        found = [fetched.get(path) for path in paths]
    return [None if data is None else parse_sidecar(data) for data in found]


def query_parts(con: Any, q: str) -> list[str]:
    """The whitespace-free parts of `q` lower-cased as the scan lower-cases text (DuckDB's `lower`)."""
    cursor = con.cursor()
    try:
        lowered = cursor.execute("SELECT lower(?)", [q]).fetchone()
    finally:
        cursor.close()
    return [part for part in _PYTHON_WHITESPACE.split(lowered[0] if lowered else q) if part]


def candidate_files(con: Any, files: list[StoredFile], q: str | None, prompt: str | None) -> list[StoredFile]:
    """The files that may hold a rollout matching the text search `q` and the exact `prompt`: the files
    whose sidecar cannot rule it out, and every file without a current sidecar (scanned)."""
    return [f for chunk in candidate_chunks(con, files, q, prompt, len(files) or 1) for f in chunk]


def candidate_chunks(
    con: Any, files: list[StoredFile], q: str | None, prompt: str | None, size: int
) -> Iterator[list[StoredFile]]:
    """`candidate_files` in order, `size` at a time, reading the sidecars only as far as the caller
    consumes: a query that fills its page from the first files never reads the rest."""
    parts = [part.encode("utf-8") for part in query_parts(con, q)] if q else []
    wanted = prompt_hash(prompt) if prompt is not None else None
    if not parts and wanted is None:
        for start in range(0, len(files), size):
            yield files[start : start + size]
        return
    kept: list[StoredFile] = []
    for start in range(0, len(files), SIDECARS_PER_READ):
        window = files[start : start + SIDECARS_PER_READ]
        for f, sidecar in zip(window, read_sidecars(window)):
            if sidecar is None or not sidecar.fits(f) or sidecar.may_hold(parts, wanted):
                kept.append(f)
        while len(kept) >= size:
            yield kept[:size]
            kept = kept[size:]
    if kept:
        yield kept

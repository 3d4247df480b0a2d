"""``grainlike-inspect``: explain a checkpoint state or an ArrayRecord file in words.

``grainlike-inspect PATH ...`` takes state files, checkpoint directories (every
``process_*-of-*.json`` in them, as Orbax writes) and ArrayRecord files (record
count, writer options and record ``--record K`` decoded); ``--workers W`` /
``--processes M`` add how a checkpoint restores on W workers per process or on M
processes (elastic restore: where each worker starts, what it skips, what remains).

A state (grain 0.2.18's JSON, see "State" in ``docs/concepts.md``) stores, for
each worker ``i``, the last global index it produced: with ``W`` workers
(``W = 0`` counts as one) and ``S`` shards, ``G = W * S`` and worker ``i`` has
read ``next_i = (last_i + G - shard_index - i * S) // G`` of the shard's
positions. Their sum is how far the shard is into the sampler's sequence;
dividing by the shard's records per epoch gives the epoch.

Python use: ``describe_state(bytes_or_dict)``, ``describe_array_record(path)``
and ``describe_path(path)`` return the text that ``main`` prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from grainlike.core import index_set, sharding

__all__ = [
    "describe_array_record",
    "describe_path",
    "describe_path_restore",
    "describe_restore",
    "describe_state",
    "main",
]

_INDEX_SAMPLER = re.compile(
    r"IndexSampler\(num_records=(?P<num_records>\d+), "
    r"shard_options=(?P<shard_type>\w+)\(shard_index=(?P<shard_index>\d+), "
    r"shard_count=(?P<shard_count>\d+), drop_remainder=(?P<drop>True|False)\), "
    r"shuffle=(?P<shuffle>True|False), num_epochs=(?P<num_epochs>None|\d+), "
    r"seed=(?P<seed>None|-?\d+)\)"
)
_STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")
_STATE_KEYS = ("last_seen_indices", "last_worker_index", "worker_count", "sampler", "data_source")
_MAX_STATE_BYTES = 16 << 20


def _plural(n: int, word: str, plural: str = "") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {plural or word + 's'}"


def _load_state(state: Union[bytes, str, dict], where: str) -> dict:
    if isinstance(state, dict):
        data = state
    else:
        try:
            data = json.loads(state)
        except ValueError as e:
            raise ValueError(f"{where}: not a JSON checkpoint state ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a checkpoint state is a JSON object, got {type(data).__name__}")
    missing = [k for k in _STATE_KEYS if k not in data]
    if missing:
        raise ValueError(
            f"{where}: not a DataLoader checkpoint state: keys {missing} are missing "
            f"(expected {', '.join(_STATE_KEYS)})"
        )
    return data


def describe_state(state: Union[bytes, str, dict], name: str = "state") -> str:
    """Explains a DataLoader state (``iterator.get_state()``) in plain words.

    Args:
      state: the state's JSON (bytes or str) or the parsed dict.
      name: how to call it in the first line (e.g. its file name).

    Returns:
      Several lines of text.

    Raises:
      ValueError: ``state`` is not such a state (the message says what is missing).
    """
    data = _load_state(state, name)
    workers = int(data["worker_count"])
    w = max(workers, 1)
    last_seen = {int(k): int(v) for k, v in data["last_seen_indices"].items()}
    lines = [f"Checkpoint state {name}"]
    lines.append(f"  format: grain DataLoader state, version {data.get('version', '(none)')}")
    lines.append(f"  data source: {data['data_source']}")
    m = _INDEX_SAMPLER.fullmatch(data["sampler"])
    if m is None:
        lines.append(f"  sampler: {data['sampler']}")
        lines.append("    (not an IndexSampler: positions are shown, epochs are not computed)")
        shard_index, shard_count = 0, 1
    else:
        num_records = int(m["num_records"])
        shard_index, shard_count = int(m["shard_index"]), int(m["shard_count"])
        drop = m["drop"] == "True"
        num_epochs = None if m["num_epochs"] == "None" else int(m["num_epochs"])
        order = f"shuffled with seed {m['seed']}" if m["shuffle"] == "True" else "in order"
        if m["shuffle"] != "True" and m["seed"] != "None":
            order += f" (seed {m['seed']} for random transforms)"
        epochs = "repeating forever" if num_epochs is None else _plural(num_epochs, "epoch")
        lines.append(f"  sampler: IndexSampler over {num_records} records, {order}, {epochs}")
        start, end = sharding.even_split(num_records, sharding.ShardOptions(shard_index, shard_count, drop))
        per_epoch = end - start
        if shard_count == 1:
            lines.append(f"  sharding: none ({m['shard_type']}): all {num_records} records each epoch")
        else:
            lines.append(
                f"  sharding: shard {shard_index} of {shard_count} ({m['shard_type']}, drop_remainder={drop}): "
                f"records [{start}, {end}), {per_epoch} per epoch"
            )
    g = w * shard_count
    lines.append(
        f"  workers: {workers}" + (" (reading in the main process)" if workers == 0 else "")
    )
    last_worker = int(data["last_worker_index"])
    if workers > 1:
        nxt = (last_worker + 1) % w
        if last_worker < 0:
            lines.append(f"  round-robin: at the start of a cycle; worker {nxt} produces next")
        else:
            lines.append(f"  round-robin: worker {last_worker} produced last; worker {nxt} produces next")
    total = 0
    for i in sorted(last_seen):
        last = last_seen[i]
        consumed = (last + g - shard_index - i * shard_count) // g
        total += max(consumed, 0)
        label = f"worker {i}" if workers else "main process"
        if consumed <= 0:
            lines.append(f"  {label}: nothing read yet; first global index {last + g}")
        else:
            lines.append(
                f"  {label}: read {_plural(consumed, 'position')}, last at global index {last}; "
                f"next is global index {last + g}"
            )
    skip = index_set.decode(data.get("skip_indices") or [], "state['skip_indices']", 10**8)
    if skip:
        shown = ", ".join(str(g) for g in skip[:8]) + (", ..." if len(skip) > 8 else "")
        lines.append(
            f"  skipped: {_plural(len(skip), 'global index')} above the workers' positions were "
            f"delivered before an elastic restore and are not read again: {shown}"
        )
        total += len(skip)
    if m is not None:
        lines.append("  " + _progress(total, per_epoch, num_records, num_epochs, shard_index, shard_count, drop))
    lines.append(
        "  (positions count records read from the source, before any filter; a batch holds several)"
    )
    return "\n".join(lines)


def _progress(total, per_epoch, num_records, num_epochs, shard_index, shard_count, drop) -> str:
    if per_epoch <= 0:
        return "progress: this shard holds no records"
    epoch, into = divmod(total, per_epoch)
    if num_epochs is None:
        return (
            f"progress: {_plural(total, 'position')} read: epoch {epoch + 1} in progress "
            f"({into} of its {per_epoch} records read, {_plural(epoch, 'epoch')} complete)"
        )
    max_index = num_epochs * num_records
    if drop and shard_count > 1:
        max_index = min(max_index, per_epoch * shard_count * num_epochs)
    # The shard reads global indices shard_index, shard_index + S, ... below max_index.
    end = max(0, -(-(max_index - shard_index) // shard_count))
    share = f"{_plural(total, 'position')} of {end} read ({100.0 * total / end:.1f}%)" if end else "nothing to read"
    if total >= end:
        return f"progress: {share}: finished (the last of {_plural(num_epochs, 'epoch')} is read)"
    return (
        f"progress: {share}: in epoch {epoch + 1} of {num_epochs}, "
        f"{into} of its {per_epoch} records read"
    )



def _sampler_of(data: dict, shard: Optional[tuple[int, int]] = None) -> Any:
    """The IndexSampler a state names (re-sharded as ``shard``), or None for another sampler."""
    from grainlike.core import samplers

    m = _INDEX_SAMPLER.fullmatch(data["sampler"])
    if m is None:
        return None
    index, count = shard or (int(m["shard_index"]), int(m["shard_count"]))
    drop = m["drop"] == "True"
    if m["shard_type"] == "NoSharding" and count == 1:
        options = sharding.NoSharding()
    else:
        options = sharding.ShardOptions(index, count, drop)
    return samplers.IndexSampler(
        int(m["num_records"]),
        options,
        shuffle=m["shuffle"] == "True",
        num_epochs=None if m["num_epochs"] == "None" else int(m["num_epochs"]),
        seed=None if m["seed"] == "None" else int(m["seed"]),
    )


def _codec(data: dict, workers: int, shard_index: int, shard_count: int, sampler: Any) -> Any:
    from grainlike.loader import legacy_state as state_lib

    if sampler is None:
        local_length = sys.maxsize // 2
    else:
        options = sharding.ShardOptions(shard_index, shard_count, sampler.shard_options.drop_remainder)
        local_length = sharding.strided_shard_size(len(sampler), options)  # as the DataLoader's shard
    return state_lib.LegacyState(
        workers,
        shard_index,
        shard_count,
        repr(sampler) if sampler is not None else data["sampler"],
        data["data_source"],
        tuple(state_lib.worker_lengths(local_length, workers)),
    )


def _positions_line(label: str, codec: Any, positions: Any, known: bool) -> str:
    read = sum(positions.next_positions) + len(positions.skip)
    left = f"{codec.local_length - read} remain" if known else "the total is unknown (not an IndexSampler)"
    skip = f", {len(positions.skip)} delivered above them skipped" if positions.skip else ""
    return (
        f"  {label}: next positions per worker {positions.next_positions}{skip}; "
        f"{read} positions delivered, {left}"
    )


def describe_restore(
    states: dict, process_count: int, *, workers: Optional[int] = None, processes: Optional[int] = None
) -> str:
    """How the states of ``process_count`` processes restore on ``workers`` / ``processes``.

    Args:
      states: each old process's state (JSON bytes, str or dict) by process index.
      process_count: how many processes wrote them.
      workers: the new worker count per process (None: each state's own).
      processes: the new process count (None: ``process_count``).

    Returns:
      Lines saying, per new process, where each worker starts, how many delivered
      positions it skips and how many remain; or why the restore is impossible.
    """
    from grainlike.loader import elastic_restore as elastic
    from grainlike.loader import legacy_state as state_lib

    datas = {i: _load_state(s, f"state of process {i}") for i, s in states.items()}
    m_count = process_count if processes is None else processes
    w_text = "each state's worker count" if workers is None else _plural(workers, "worker")
    procs, m_procs = _plural(process_count, "process", "processes"), _plural(m_count, "process", "processes")
    lines = [f"Restore of the states of {procs} on {m_procs} with {w_text}"]
    try:
        if m_count == process_count:
            for i in sorted(datas):
                data = datas[i]
                sampler = _sampler_of(data)
                new_w = int(data["worker_count"]) if workers is None else workers
                new = _codec(data, new_w, i, process_count, sampler)
                positions = new.decode(data)
                lines.append(_positions_line(f"process {i}", new, positions, sampler is not None))
            return "\n".join(lines)
        any_data = datas[min(datas)]
        for j in range(m_count):
            sampler = _sampler_of(any_data, (j, m_count))
            if sampler is None:
                raise state_lib.InvalidStateError(
                    f"the sampler {any_data['sampler']!r} is not an IndexSampler: only an "
                    "IndexSampler's records per shard can be recomputed for another process count"
                )
            new_w = int(any_data["worker_count"]) if workers is None else workers
            codec = _codec(any_data, new_w, j, m_count, sampler)
            positions = elastic.sampler_process_states(sampler, codec, datas, process_count)
            lines.append(_positions_line(f"process {j} of {m_count}", codec, positions, True))
    except (state_lib.InvalidStateError, KeyError) as e:
        lines.append(f"  cannot restore: {e}")
    return "\n".join(lines)



def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _conversion_metadata(path: str) -> Optional[tuple[str, dict]]:
    m = re.fullmatch(r"(.*)-\d{5}-of-\d{5}\.array_record", path)
    if not m or not os.path.exists(m.group(1) + ".json"):
        return None
    try:
        with open(m.group(1) + ".json") as f:
            return m.group(1) + ".json", json.load(f)
    except (OSError, ValueError):
        return None


def describe_array_record(path: str, record: int = 0) -> str:
    """Summarises an ArrayRecord file: count, options, and one decoded record.

    Records in grainlike's format (``grainlike-convert``) are decoded field by
    field; other records are shown as their first bytes.

    Args:
      path: the file.
      record: which record to show (``-1`` for none).

    Raises:
      FileNotFoundError / ValueError: the file is missing or not ArrayRecord.
      IndexError: ``record`` is out of range (the message gives the count).
    """
    from grainlike.sources.formats import record_codec as formats  # pylint: disable=g-import-not-at-top
    from grainlike.sources.formats.array_record_files import open_reader  # pylint: disable=g-import-not-at-top

    reader = open_reader(path, "readahead_buffer_size:0")
    try:
        count = reader.num_records()
        options = reader.writer_options_string()
        lines = [f"ArrayRecord file {path} ({_size(os.path.getsize(path))})"]
        lines.append(f"  records: {count}")
        lines.append(f"  writer options: {options or '(unknown)'}")
        meta = _conversion_metadata(path)
        if meta is not None:
            meta_path, info = meta
            detail = f"{info.get('num_records', '?')} records in {len(info.get('shards', []))} shard(s)"
            lines.append(f"  written by grainlike-convert ({info.get('format', '?')}): {meta_path}, {detail}")
            if "source" in info:
                lines.append(f"    from: {info['source']}")
            if "classes" in info:
                lines.append(f"    classes (label = index): {', '.join(info['classes'])}")
        elif os.path.exists(os.path.join(os.path.dirname(path) or ".", "features.json")):
            lines.append(
                "  part of a TFDS dataset (features.json alongside): records are serialized "
                "tf.train.Examples; read them with grainlike.sources.tfds.tfds_source(...)"
            )
        if record < 0 or count == 0:
            return "\n".join(lines)
        if record >= count:
            raise IndexError(f"{path}: record {record} is out of range; the file has {count} records")
        data = reader.read([record])[0]
    finally:
        reader.close()
    if data[:4] != formats.MAGIC:
        lines.append(f"  record {record}: {len(data)} bytes, not in grainlike's record format; starts with {data[:32]!r}")
        return "\n".join(lines)
    lines.append(f"  record {record}: {len(data)} bytes in grainlike's record format:")
    lines.extend(f"    {text}" for text in formats.describe_record(data, show_values=True))
    return "\n".join(lines)



def _state_files(directory: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found.extend(os.path.join(root, f) for f in sorted(files) if _STATE_FILE.fullmatch(f))
    return found


def describe_path(path: str, record: int = 0) -> str:
    """Describes a state file, a checkpoint directory, or an ArrayRecord file.

    Raises:
      FileNotFoundError: ``path`` does not exist, or a directory holds no
        ``process_*-of-*.json`` state.
      ValueError: a file that is neither a state nor an ArrayRecord file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = _state_files(path)
        if not files:
            raise FileNotFoundError(
                f"{path}: no checkpoint state found (looked for process_<i>-of-<n>.json files, "
                "as Grain's and grainlike's Orbax handlers write)"
            )
        return "\n\n".join(describe_path(f, record) for f in files)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        head = f.read(1024)
    if head.lstrip()[:1] == b"{":
        if os.path.getsize(path) > _MAX_STATE_BYTES:
            raise ValueError(f"{path}: a {_size(os.path.getsize(path))} JSON file is too large to be a state")
        with open(path, "rb") as f:
            return describe_state(f.read(), name=path)
    try:
        return describe_array_record(path, record)
    except ValueError as e:
        raise ValueError(
            f"{path}: neither a checkpoint state (JSON) nor an ArrayRecord file ({e})"
        ) from e


def describe_path_restore(path: str, *, workers: Optional[int] = None, processes: Optional[int] = None) -> str:
    """``describe_restore`` for a state file or the ``process_*-of-N.json`` files of a directory.

    Raises:
      FileNotFoundError: no state there.
      ValueError: the directory holds states of several process counts.
    """
    path = os.fspath(path)
    groups: dict = {}
    files = _state_files(path) if os.path.isdir(path) else [path]
    if not files:
        raise FileNotFoundError(f"{path}: no checkpoint state found")
    for f in files:
        m = _STATE_FILE.fullmatch(os.path.basename(f))
        index, count = (int(m[1]), int(m[2])) if m else (0, 1)
        with open(f, "rb") as fh:
            groups.setdefault((os.path.dirname(f), count), {})[index] = fh.read()
    return "\n\n".join(
        f"{where or '.'}:\n" + describe_restore(states, count, workers=workers, processes=processes)
        for (where, count), states in sorted(groups.items())
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``grainlike-inspect``; returns the exit status (0 on success, 1 on error)."""
    parser = argparse.ArgumentParser(
        prog="grainlike-inspect",
        description="Explain a DataLoader checkpoint state (a JSON file, or an Orbax checkpoint "
        "directory) or summarise an ArrayRecord file.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH")
    parser.add_argument("-r", "--record", type=int, default=0, help="which record of an ArrayRecord file to decode (-1: none)")
    parser.add_argument("--workers", type=int, default=None, metavar="W", help="also show how the state restores on W workers per process")
    parser.add_argument("--processes", type=int, default=None, metavar="M", help="also show how the checkpoint restores on M JAX processes")
    args = parser.parse_args(argv)
    status = 0
    for i, path in enumerate(args.paths):
        try:
            text = describe_path(path, args.record)
            if args.workers is not None or args.processes is not None:
                text += "\n\n" + describe_path_restore(path, workers=args.workers, processes=args.processes)
        except (OSError, ValueError, IndexError) as e:
            print(f"grainlike-inspect: error: {e}", file=sys.stderr)
            status = 1
            continue
        print(("\n" if i else "") + text)
    return status


if __name__ == "__main__":
    sys.exit(main())

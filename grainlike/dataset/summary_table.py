"""The table of an ``ExecutionSummary`` that grain's debug mode logs (``pretty_format_summary``).

One row per node, highest id first; columns ``id``, ``name``, ``inputs``,
``percent wait time``, the processing times (total, min, max, avg), ``num
produced elements`` and ``memory usage`` (what a prefetch node holds). Cells
wider than 30 characters wrap, over at most 5 lines.
"""

from __future__ import annotations

from typing import Any

_MAX_WIDTH = 30
_MAX_LINES = 5
_AVG = "avg processing time"
_MEMORY = "memory usage"
_TIMES = ("total_processing_time_ns", "min_processing_time_ns", "max_processing_time_ns", _AVG)
_HEADERS = {
    "wait_time_ratio": "percent wait time",
    "total_processing_time_ns": "total processing time",
    "min_processing_time_ns": "min processing time",
    "max_processing_time_ns": "max processing time",
    "num_produced_elements": "num produced elements",
}
_COLUMNS = ("id", "name", "inputs", "wait_time_ratio", "total_processing_time_ns", "min_processing_time_ns",
            "max_processing_time_ns", _AVG, "num_produced_elements", _MEMORY)


def format_ns(value: int) -> str:
    """``value`` nanoseconds as ``12ns``, ``1.20us``, ``3.40ms`` or ``2.00s``."""
    for scale, unit in ((1_000_000_000, "s"), (1_000_000, "ms"), (1000, "us")):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value}ns"


def format_bytes(value: int) -> str:
    """``value`` bytes as ``12 bytes``, ``1.50 KiB``, ... ``TiB``."""
    if value < 1024:
        return f"{value} bytes"
    scaled, unit = value / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, larger
    return f"{scaled:.2f} {unit}"


def _cell(column: str, node: Any) -> str:
    if column == "wait_time_ratio" and node.is_prefetch:
        return "N/A"  # its consumer's wait is shown on the nodes under it
    if column in _TIMES and node.total_processing_time_ns == 0:
        return "N/A"  # nothing produced yet
    if column == _AVG:
        n = node.num_produced_elements
        return format_ns(int(node.total_processing_time_ns / n) if n else 0)
    if column == _MEMORY:
        return format_bytes(max(0, node.bytes_consumed - node.bytes_produced) if node.is_prefetch else 0)
    value = getattr(node, column)
    if column == "wait_time_ratio":
        return f"{value * 100:.2f}%"
    if column in _TIMES:
        return format_ns(value)
    if column == "inputs":
        return str(list(value))
    return str(value)


def pretty_format_summary(summary: Any) -> str:
    """``summary`` as grain's debug-mode table."""
    rows = [[_HEADERS.get(c, c) for c in _COLUMNS]]
    rows += [[_cell(c, summary.nodes[i]) for c in _COLUMNS] for i in sorted(summary.nodes, reverse=True)]
    widths = [min(max(len(row[j]) for row in rows), _MAX_WIDTH) for j in range(len(_COLUMNS))]
    rule = "|" + "".join("-" * (w + 2) for w in widths) + "-" * (len(widths) - 1) + "|\n"
    out = [rule]
    for row in rows:
        lines = min(max(len(cell) for cell in row) // _MAX_WIDTH + 1, _MAX_LINES)
        for line in range(lines):
            parts = (cell[line * _MAX_WIDTH:(line + 1) * _MAX_WIDTH].ljust(w) for cell, w in zip(row, widths))
            out.append("|" + "".join(f" {part} |" for part in parts) + "\n")
        out.append(rule)
    return "".join(out)


def sorted_by_wait_time(summary: Any) -> Any:
    """A copy of ``summary`` whose nodes are renumbered in increasing ``wait_time_ratio``."""
    nodes = sorted(summary.nodes.values(), key=lambda node: node.wait_time_ratio)
    result = type(summary)()
    for i, node in enumerate(nodes):
        result.nodes[i].CopyFrom(node)
    return result


def summary_log_message(summary: Any) -> str:
    """What debug mode logs: the table of ``summary``, its nodes by increasing wait, and grain's warning."""
    summary = sorted_by_wait_time(summary)
    message = (
        "Grain Dataset Execution Summary:\n\nNOTE: Before analyzing the"
        " `total_processing_time` for a node, please check the `percent"
        " wait time` column to ensure that the node is indicated as"
        " bottleneck. The `MapDataset` nodes are executed in multiple"
        " threads and thus, should not be compared to the"
        " `total_processing_time` of `DatasetIterator` nodes."
        f"\n\n{pretty_format_summary(summary)}"
    )
    if summary.nodes and "SourceMapDataset" in summary.nodes[len(summary.nodes) - 1].name:
        message += (
            "\nWARNING: Your source is likely the bottleneck. Please ensure if you"
            " have enough spindle quota or if your data is co-located with the"
            " computation. "
        )
    return message

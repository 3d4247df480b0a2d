"""grain's ``execution_summary.proto`` messages: ``ExecutionSummary`` (with ``Node``) and ``ExecutionSummaries``.

The file descriptor is built here field by field with the protobuf runtime, with
grain's file name, package, messages, field numbers and types, so messages
serialized by grain parse here and the other way round. When grain's generated
module is loaded in the same process, the file is already in protobuf's default
pool and its descriptor is shared (the messages are then grain's own classes).

Example:
  >>> from grainlike.proto import execution_summary_pb2 as pb
  >>> summary = pb.ExecutionSummary()
  >>> summary.nodes[0].name = "MapDatasetIterator"
  >>> pb.ExecutionSummary.FromString(summary.SerializeToString()).nodes[0].name
  'MapDatasetIterator'
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FILE_NAME = "grain/proto/execution_summary.proto"
_PACKAGE = "grain.python.execution_summary"

_F = descriptor_pb2.FieldDescriptorProto
# ExecutionSummary.Node: (name, number, type, repeated).
_NODE_FIELDS = (
    ("id", 2, _F.TYPE_INT32, False),
    ("name", 3, _F.TYPE_STRING, False),
    ("inputs", 4, _F.TYPE_INT32, True),
    ("wait_time_ratio", 5, _F.TYPE_DOUBLE, False),
    ("total_processing_time_ns", 6, _F.TYPE_INT64, False),
    ("min_processing_time_ns", 7, _F.TYPE_INT64, False),
    ("max_processing_time_ns", 8, _F.TYPE_INT64, False),
    ("num_produced_elements", 9, _F.TYPE_INT64, False),
    ("output_spec", 10, _F.TYPE_STRING, False),
    ("is_output", 11, _F.TYPE_BOOL, False),
    ("is_prefetch", 12, _F.TYPE_BOOL, False),
    ("bytes_consumed", 13, _F.TYPE_INT64, False),
    ("bytes_produced", 14, _F.TYPE_INT64, False),
)


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, repeated: bool = False,
           type_name: str = "") -> None:
    field = message.field.add(name=name, number=number, type=kind)
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    """grain's ``execution_summary.proto``, as a ``FileDescriptorProto``."""
    file = descriptor_pb2.FileDescriptorProto(name=_FILE_NAME, package=_PACKAGE, syntax="proto3")
    summary = file.message_type.add(name="ExecutionSummary")
    _field(summary, "nodes", 1, _F.TYPE_MESSAGE, repeated=True, type_name="ExecutionSummary.NodesEntry")
    node = summary.nested_type.add(name="Node")
    for name, number, kind, repeated in _NODE_FIELDS:
        _field(node, name, number, kind, repeated)
    entry = summary.nested_type.add(name="NodesEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_INT32)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name="ExecutionSummary.Node")
    summaries = file.message_type.add(name="ExecutionSummaries")
    _field(summaries, "execution_summaries", 1, _F.TYPE_MESSAGE, repeated=True, type_name="ExecutionSummary")
    return file


def _descriptor():
    pool = descriptor_pool.Default()
    try:  # grain's generated module (or an earlier import) added it already.
        return pool.FindFileByName(_FILE_NAME)
    except KeyError:
        return pool.Add(_file_proto()) or pool.FindFileByName(_FILE_NAME)


DESCRIPTOR = _descriptor()
ExecutionSummary = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["ExecutionSummary"])
ExecutionSummaries = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["ExecutionSummaries"])

__all__ = ["DESCRIPTOR", "ExecutionSummaries", "ExecutionSummary"]

"""A reader's view of OTLP's ExportTraceServiceRequest: the same bytes, only the fields a request
record needs, and attributes as a map.

opentelemetry-proto's messages list a span's attributes as `repeated KeyValue`, and reading a dozen
of them through the protobuf runtime (a Python object for every key and every value) took as long
as all the rest of an export's ingest. On the wire a map entry is a message with the key as field 1
and the value as field 2, which is exactly a KeyValue; so these messages declare the same field
numbers with attributes as `map<string, AnyValue>`, and the protobuf library parses an export into
them, letting the few attributes wanted be looked up by key. Fields not declared here (events,
links, status, ...) are skipped by the parser. A key sent twice keeps its last value, as a dict
built from the list would.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import DescriptorProto, FieldDescriptorProto
from opentelemetry.proto.common.v1 import common_pb2

_PACKAGE = "prefixscope.otlp_reader"
_ANY_VALUE = "." + common_pb2.AnyValue.DESCRIPTOR.full_name
_T, _L = FieldDescriptorProto.Type, FieldDescriptorProto.Label


def _field(
    name: str, number: int, kind: int, message: str = "", *, repeated: bool = False
) -> FieldDescriptorProto:
    label = _L.LABEL_REPEATED if repeated else _L.LABEL_OPTIONAL
    field = FieldDescriptorProto(name=name, number=number, type=kind, label=label)
    if message:  # set, even empty, it would say the field is a message
        field.type_name = message
    return field


def _with_attributes(name: str, number: int, *fields: FieldDescriptorProto) -> DescriptorProto:
    """A message with `fields` and `map<string, AnyValue> attributes = number`."""
    entry = DescriptorProto(
        name="AttributesEntry",
        field=[_field("key", 1, _T.TYPE_STRING), _field("value", 2, _T.TYPE_MESSAGE, _ANY_VALUE)],
        options=descriptor_pb2.MessageOptions(map_entry=True),
    )
    attributes = _field(
        "attributes", number, _T.TYPE_MESSAGE, f".{_PACKAGE}.{name}.AttributesEntry", repeated=True
    )
    return DescriptorProto(name=name, field=[*fields, attributes], nested_type=[entry])


def _messages() -> descriptor_pb2.FileDescriptorProto:
    # Field numbers from opentelemetry/proto/trace/v1/trace.proto and resource/v1/resource.proto.
    span = _with_attributes(
        "Span", 9,
        _field("trace_id", 1, _T.TYPE_BYTES),
        _field("name", 5, _T.TYPE_STRING),
        _field("start_time_unix_nano", 7, _T.TYPE_FIXED64),
    )  # fmt: skip
    resource = _with_attributes("Resource", 1)
    scope_spans = DescriptorProto(
        name="ScopeSpans", field=[_field("spans", 2, _T.TYPE_MESSAGE, f".{_PACKAGE}.Span", repeated=True)]
    )
    resource_spans = DescriptorProto(
        name="ResourceSpans",
        field=[
            _field("resource", 1, _T.TYPE_MESSAGE, f".{_PACKAGE}.Resource"),
            _field("scope_spans", 2, _T.TYPE_MESSAGE, f".{_PACKAGE}.ScopeSpans", repeated=True),
        ],
    )
    export = DescriptorProto(
        name="Export",
        field=[_field("resource_spans", 1, _T.TYPE_MESSAGE, f".{_PACKAGE}.ResourceSpans", repeated=True)],
    )
    return descriptor_pb2.FileDescriptorProto(
        name="prefixscope/otlp_reader.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=[common_pb2.DESCRIPTOR.name],
        message_type=[span, resource, scope_spans, resource_spans, export],
    )


_pool = descriptor_pool.Default()  # where opentelemetry-proto's AnyValue is
_pool.Add(_messages())
Export = message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{_PACKAGE}.Export"))

"""`tf.train.Example` as a protobuf message class that does not import TensorFlow.

The job's worker processes encode every record as an Example. TensorFlow's own class
(`tensorflow/core/example/example.proto`) lives inside the TensorFlow package, whose import
costs a worker ~6 CPU-seconds and ~500 MiB on a 2-core machine (~13 CPU-seconds where the
libraries' bytecode is not compiled) before it checks a record. The messages below declare
the same fields, numbers and types as TensorFlow's example.proto and feature.proto
(protobuf's wire format carries only those), and protobuf itself does the encoding: the
bytes are the ones TensorFlow writes, and TensorFlow parses them (tests/test_data_contract.py
compares the two). (The workers' checks now import TensorFlow to decode images,
beam/contract/decoding.py; this class still keeps TensorFlow out of every other user of the
contract that encodes Examples.)
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _message(name: str, *fields: tuple[str, int, int, str | None], label: int = _F.LABEL_OPTIONAL,
             packed: bool = False) -> descriptor_pb2.DescriptorProto:
    """A message of (field name, number, type, message type name) fields."""
    message = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind, type_name in fields:
        field = message.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
        if packed:
            field.options.packed = True
    return message


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="detpipe/tf_example.proto", package="tensorflow",
                                               syntax="proto3")
    repeated = _F.LABEL_REPEATED
    proto.message_type.extend([
        _message("BytesList", ("value", 1, _F.TYPE_BYTES, None), label=repeated),
        _message("FloatList", ("value", 1, _F.TYPE_FLOAT, None), label=repeated, packed=True),
        _message("Int64List", ("value", 1, _F.TYPE_INT64, None), label=repeated, packed=True),
    ])
    feature = _message("Feature", ("bytes_list", 1, _F.TYPE_MESSAGE, ".tensorflow.BytesList"),
                       ("float_list", 2, _F.TYPE_MESSAGE, ".tensorflow.FloatList"),
                       ("int64_list", 3, _F.TYPE_MESSAGE, ".tensorflow.Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    # map<string, Feature> feature = 1: protobuf spells a map as a repeated entry message.
    features = _message("Features", ("feature", 1, _F.TYPE_MESSAGE, ".tensorflow.Features.FeatureEntry"),
                        label=repeated)
    entry = _message("FeatureEntry", ("key", 1, _F.TYPE_STRING, None), ("value", 2, _F.TYPE_MESSAGE,
                                                                        ".tensorflow.Feature"))
    entry.options.map_entry = True
    features.nested_type.append(entry)
    proto.message_type.extend([feature, features,
                               _message("Example", ("features", 1, _F.TYPE_MESSAGE, ".tensorflow.Features"))])
    return proto


# A pool of its own: TensorFlow's classes, when a process also imports them, keep theirs.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _class(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"tensorflow.{name}"))


Example, Features, Feature = _class("Example"), _class("Features"), _class("Feature")
BytesList, FloatList, Int64List = _class("BytesList"), _class("FloatList"), _class("Int64List")

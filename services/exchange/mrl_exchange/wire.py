"""Wire twins: `RawSubscribeResponse` encodes to exactly a `mrl.v1.SubscribeResponse`.

A Redis entry already holds the serialized Experience. Decoding it only to encode it again
inside a Delivery costs two passes over ~1 KiB per delivery. An embedded message and a
`bytes` field share one wire format (tag, length, bytes), so the twins below — copies of
`Delivery` and `SubscribeResponse` whose `experience` field is `bytes` — let the exchange
forward the stored bytes untouched. They are derived from the contract's own descriptors at
import, so they cannot drift from it; tests/test_exchange_wire.py checks the encodings agree.
"""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from mrl.v1 import exchange_pb2 as xpb

__all__ = ["RawDelivery", "RawSubscribeResponse"]

_PACKAGE = "mrl_exchange.wire"


def _twins():
    file = descriptor_pb2.FileDescriptorProto(name="mrl_exchange/wire.proto", package=_PACKAGE, syntax="proto3")
    for message in (xpb.Delivery, xpb.SubscribeResponse):
        twin = file.message_type.add()
        message.DESCRIPTOR.CopyToProto(twin)
        for field in twin.field:
            if field.type_name == ".mrl.v1.Experience":
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                field.ClearField("type_name")
            elif field.type_name == ".mrl.v1.Delivery":
                field.type_name = f".{_PACKAGE}.Delivery"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return [message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in ("Delivery", "SubscribeResponse")]


RawDelivery, RawSubscribeResponse = _twins()

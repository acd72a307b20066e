"""The exchange's wire twin encodes to exactly the contract's SubscribeResponse."""
from helpers import one_of_each
from mrl.v1 import exchange_pb2 as xpb
from mrl_exchange.wire import RawSubscribeResponse


def test_raw_subscribe_response_is_wire_identical_to_subscribe_response():
    experiences = one_of_each("run-1")
    raw = RawSubscribeResponse(subscription_id="sub-1")
    public = xpb.SubscribeResponse(subscription_id="sub-1")
    for i, e in enumerate(experiences):
        fields = {"delivery_id": f"rollout:policy-a:{i}-0", "redelivered": i % 2 == 1, "appended_at_ms": 1000 + i}
        raw.deliveries.add(experience=e.SerializeToString(), **fields)
        public.deliveries.add(experience=e, **fields)
    assert raw.SerializeToString() == public.SerializeToString()
    assert xpb.SubscribeResponse.FromString(raw.SerializeToString()) == public


def test_twin_fields_mirror_the_contract():
    for twin, contract in ((RawSubscribeResponse.DESCRIPTOR, xpb.SubscribeResponse.DESCRIPTOR),
                           (RawSubscribeResponse.DESCRIPTOR.fields_by_name["deliveries"].message_type,
                            xpb.Delivery.DESCRIPTOR)):
        assert [(f.name, f.number) for f in twin.fields] == [(f.name, f.number) for f in contract.fields]

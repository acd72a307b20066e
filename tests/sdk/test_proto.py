"""The committed stubs are what `make proto` generates from proto/ now."""
import pathlib

from helpers import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_protos(tmp_path):
    fresh = load_script("gen_proto").generate(tmp_path)
    committed = ROOT / "sdk" / "mrl" / "v1"
    assert {p.name for p in fresh} == {p.name for p in committed.glob("*.py*") if p.name != "__init__.py"}
    stale = [p.name for p in fresh if p.read_bytes() != (committed / p.name).read_bytes()]
    assert not stale, f"stubs out of date: {stale}; run `make proto` and commit them"


def test_every_experience_kind_has_an_envelope_field_and_an_enum_value():
    from mrl import experience
    from mrl.v1 import experience_pb2 as pb
    oneof = {f.name for f in pb.Experience.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert oneof == set(experience.KINDS)
    assert {experience.kind_name(experience.kind_enum(k)) for k in experience.KINDS} == set(experience.KINDS)
    envelope = {f.name for f in pb.Experience.DESCRIPTOR.fields} - oneof
    assert envelope == {"experience_id", "run_id", "producer", "policy_version", "created_at", "schema_version"}


def test_all_three_services_are_in_the_contract():
    from mrl.v1 import exchange_pb2, scheduler_pb2, tokenizer_align_pb2
    methods = {s.name: {m.name for m in s.methods} for mod in (exchange_pb2, tokenizer_align_pb2, scheduler_pb2)
               for s in mod.DESCRIPTOR.services_by_name.values()}
    assert methods == {
        "ExperienceExchange": {"Publish", "Subscribe", "Ack", "GetSuccesses", "ListTopics", "GetTopicStats", "WhoAmI"},
        "TokenizerAlign": {"Align", "AlignBatch", "RegisterTokenizer", "ListTokenizers", "WhoAmI"},
        "Scheduler": {"Acquire", "Renew", "Release", "Inventory", "Watch", "WhoAmI"},
    }

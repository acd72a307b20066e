"""Generate the Python stubs of proto/mrl/v1 into a folder (default: sdk/).

    python scripts/gen_proto.py [OUT_DIR]

The one codegen command (`make proto`); tests/test_proto.py regenerates into a
temporary folder and fails when the committed stubs differ.
"""
import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "mrl" / "v1").glob("*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / "mrl" / "v1").glob("*.py*"))


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "sdk"
    for path in generate(out):
        print(path)

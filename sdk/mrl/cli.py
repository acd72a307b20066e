"""The `mrl` command: the commands of every installed mrl package, found through entry points.

    pip install ./sdk                      mrl token new
    pip install -e services/exchange       mrl exchange serve
    pip install -e services/tokenizer_align   mrl align serve
    pip install -e services/scheduler      mrl scheduler serve
    pip install -e services/trainer        mrl trainer run, mrl trainer warm-start
    pip install -e launcher                mrl up, mrl demo, mrl experiment compare, mrl trainer plot|report
    pip install -e research                mrl bench NAME, mrl lab bandit|signal (and mrl demo --exchange)

A package declares each command in the entry-point group `mrl.commands`: the name is the
command's words joined by dots, the value a function that adds the command's arguments to its
parser and returns what runs it; the function's docstring is the command's help:

    [project.entry-points."mrl.commands"]
    "exchange.serve" = "mrl_exchange.cli:serve"

    def serve(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], None]:
        '''serve gRPC and the REST admin (settings: MRL_* env or MRL_CONFIG)'''
        return lambda args: ...

Libraries raise mrl.errors.MrlError; this module alone turns one (or settings that do not validate)
into a message on stderr and the exit code the error carries (2 unless it says otherwise).
"""
import argparse
import inspect
import pathlib
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

import yaml
from pydantic import ValidationError

from mrl.auth import add_principal, checked_entry, hash_token, new_token
from mrl.errors import MrlError

__all__ = ["main", "token_new", "GROUP"]

GROUP = "mrl.commands"
Register = Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace], None]]


def token_new(parser: argparse.ArgumentParser):
    """print a new bearer token and the auth-file entry holding its hash (or add the entry to an auth file)"""
    parser.add_argument("--name", required=True)
    parser.add_argument("--role", choices=["policy", "admin"], default="policy")
    parser.add_argument("--policy", help="policy id it acts as (default: --name)")
    parser.add_argument("--runs", nargs="+", help="runs it belongs to (default: all)")
    parser.add_argument("--auth-file", type=pathlib.Path,
                        help="add the entry to this auth file (created if missing; refused if --name is in it "
                             "already) and print only the token")

    def run(args) -> None:
        token = new_token()
        principal = {"name": args.name, "role": args.role, "runs": args.runs or ["*"],
                     "token_sha256": hash_token(token)}
        if args.role == "policy":
            principal["policy"] = args.name if args.policy is None else args.policy
        checked_entry(principal)
        if args.auth_file:
            add_principal(args.auth_file, principal)
            print(token)
            return
        print(f"# token for {args.name} (give it to the principal; it is not stored anywhere):\n# {token}")
        print(yaml.safe_dump({"principals": [principal]}, sort_keys=False), end="")
    return run


def _help(register: Register) -> str:
    return (inspect.getdoc(register) or "").split("\n")[0]


def build_parser(commands: dict[str, Register] | None = None) -> argparse.ArgumentParser:
    """The parser of every command in `commands` (default: the installed entry points), by their dotted names."""
    if commands is None:
        commands = {ep.name: ep.load() for ep in entry_points(group=GROUP)}
    parser = argparse.ArgumentParser(
        prog="mrl", description="Mutual reinforcement learning platform",
        epilog="Commands come from the installed mrl packages (the SDK, services/*, launcher/, research/); a "
               "missing command needs its package: pip install -e services/<name>, -e launcher or -e research.")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): parser.add_subparsers(dest="command",
                                                                                            required=True)}
    children: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(commands):
        words = tuple(name.split("."))
        for i in range(1, len(words)):
            children.setdefault(words[:i], []).append(words[i])
    for name in sorted(commands):
        words = tuple(name.split("."))
        for i in range(1, len(words)):          # the groups on the way, e.g. `mrl bench`
            if words[:i] not in groups:
                group = groups[words[:i - 1]].add_parser(words[i - 1],
                                                         help=", ".join(dict.fromkeys(children[words[:i]])))
                groups[words[:i]] = group.add_subparsers(dest=f"action{i}", required=True, metavar="ACTION")
        register = commands[name]
        leaf = groups[words[:-1]].add_parser(words[-1], help=_help(register), description=_help(register))
        leaf.set_defaults(run=register(leaf), words=words)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except MrlError as exc:
        print(f"mrl {' '.join(args.words)}: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except ValidationError as exc:     # settings (MRL_* or the MRL_CONFIG file) a service cannot start with
        print(f"mrl {' '.join(args.words)}: error: invalid settings: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(sys.argv[1:])

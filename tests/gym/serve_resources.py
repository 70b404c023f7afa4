"""Serve one of NeMo Gym's own resource servers from the installed package (Gym's virtualenv).

    .venv-gym/bin/python tests/gym/serve_resources.py example_single_tool_call [--port 0] \
        [--config '{"grading_rule": "seq_match"}']

Imports ``resources_servers.<name>.app`` from the nemo-gym package, builds its
``SimpleResourcesServer`` subclass with its own config class (host, port, name, plus ``--config``),
and serves ``setup_webserver()`` with uvicorn on 127.0.0.1. Port 0 picks a free port; the first line
on stdout is ``listening on http://127.0.0.1:PORT``. This stands in for ``ng_run``, which needs
Gym's head server and Ray; the app, routes and verifier are Gym's, unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import json
import socket
import sys

import uvicorn
from omegaconf import OmegaConf

from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.server_utils import ServerClient


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name", help="a folder of nemo-gym's resources_servers/, e.g. example_single_tool_call")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--config", default="{}", help="extra fields of the server's config class (JSON)")
    args = ap.parse_args()
    sys.argv = sys.argv[:1]  # Gym reads config overrides from the command line

    module = importlib.import_module(f"resources_servers.{args.name}.app")
    classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, SimpleResourcesServer)
               and c.__module__ == module.__name__]
    if len(classes) != 1:
        raise SystemExit(f"resources_servers.{args.name}.app defines {len(classes)} resource servers: {classes}")
    server_cls = classes[0]
    config_cls = server_cls.model_fields["config"].annotation

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = config_cls(host=args.host, port=port, entrypoint="app.py", name=args.name, **json.loads(args.config))
    client = ServerClient(head_server_config={"host": args.host, "port": 1}, global_config_dict=OmegaConf.create({}))
    app = server_cls(config=config, server_client=client).setup_webserver()
    print(f"listening on http://{args.host}:{port}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")).run(sockets=[sock])


if __name__ == "__main__":
    main()

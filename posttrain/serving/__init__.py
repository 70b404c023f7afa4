"""Where an environment runs when it is not in the trainer's process, and how a run gets its
environments.

``server.py`` serves any environment over HTTP (NeMo Gym's resource-server contract: ``posttrain
serve-env``), ``remote.py`` is its client (``RemoteEnvironment``, used exactly like an in-process
environment), ``gym_client.py`` the client of NeMo Gym's own resource servers (``protocol: gym``),
and ``build.py`` turns a run's ``envs`` config into environments, in process or behind a server
(it lives here, not in ``envs/``, because it builds those clients: environments import no serving
code). See docs/env_server.md.
"""

"""Serving on Ray Serve: the reward server (`digenrl reward-server`).

Besides `digenrl/runtime/`, this is the one package that imports Ray (tests/test_layering.py).
It sits on top of `digenrl.rewards`, which stays Ray-free: the wire format
(`rewards/wire.py`), the client (`rewards/client.py`) and batch scoring (`rewards/batching.py`)
work without it.

    reward_app.py     the deployment: HTTP in (safetensors), JSON out, @serve.batch scoring
    options.py        ServeOptions: every knob, checked at construction
    reward_server.py  RewardServer (start/stop on a Ray cluster), serve_forever() for the CLI
"""

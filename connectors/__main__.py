"""`python -m connectors up|down|status`: the Connect worker beside a running stack."""

from __future__ import annotations

import argparse
import json

from connectors import rest, services
from connectors.config import ConnectSettings
from stack.config import StackSettings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m connectors")
    parser.add_argument("command", choices=("up", "down", "status"))
    command = parser.parse_args().command
    stack, connect = StackSettings(), ConnectSettings()
    if command == "up":
        worker = services.up(stack, connect)
        print(f"Kafka Connect on {worker.url}, connectors: {', '.join(connect.connectors)}")
    elif command == "down":
        services.down(stack, connect)
    else:
        worker = services.worker(stack, connect)
        for name in connect.connectors:
            print(json.dumps(rest.status(worker, name)))


if __name__ == "__main__":
    main()

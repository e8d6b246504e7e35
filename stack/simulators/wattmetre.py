"""Simulated Omegawatt wattmeters ("wattmetre", Grid'5000's 50 Hz power meters) for tests,
benchmarks and `make up`: one process serving meters on loopback TCP ports, each streaming
one CSV frame per sample, 50 per second, in the layout Kwollect reads (version 2 or 3, see
producers/plugins/wattmeter/frames.py), to every client connected.

    python -m stack.simulators.wattmetre --meter wattmetre1:12001:2:24 --control-port 12000
    python -m stack.simulators.wattmetre --meters 160 --port 19500 --version 3 --channels 24
    python -m stack.simulators.wattmetre --stdout --meter wattmetre3::3:8    # frames on stdout

    with Wattmetres(state_dir, [MeterSpec("wattmetre1", 19501)], control_port=19500) as sim:
        sim.control("stop", "wattmetre1")     # a meter that hangs (connected, silent)

`--meter NAME:PORT:VERSION:CHANNELS` (repeatable) or `--meters N --port FIRST` (ports FIRST..,
names wattmetre1..). Frames carry the wall-clock time of their sample (multiples of 20 ms,
seconds with 3 decimals). Each channel's power is idle at 90-120 W with bursts to 200-300 W
for 2-15 s (a first-order lag of 0.3 s between levels) plus Gaussian noise (sigma ~1 % of the
level); the signal of a (seed, meter, channel) is the same in every run.

Version 2: `NAME,COUNTER,TIMESTAMP,OK,P0,...,Pn-1`. Version 3: `TIMESTAMP,true,COUNTER,VOLTAGE,
FREQUENCY,0,P0,I0,...,Pn-1,In-1,PTOTAL,ITOTAL,0,0,0`. Only the flag, the timestamp and the
powers are what Kwollect reads; the simulator's other fields are plausible fillers.

The control port (127.0.0.1, one command per line, answered `ok` or `error: ...`):

    stop NAME              the meter stays connected but sends nothing (a hung meter)
    resume NAME            it sends again, and listens again after `close`
    close NAME             closes its connections and its listening socket (refused)
    reset NAME             resets its connections (TCP RST)
    malformed NAME RATE    from now on, that share (0-1) of its frames is malformed
    garbage NAME           sends one burst of random bytes (a line of binary junk)
    ports                  answers `ok NAME:PORT ...` (a meter given port 0 takes a free one)
    ping                   answers `ok`

`make up DEVICES=sample` (stack/simulators/__main__.py) runs wattmetre1 (version 2, 24
channels) on 127.0.0.1:12001 and wattmetre2 (version 3, 8 channels) on 12002, control 12000.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import signal
import socket
import struct
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stack.simulators.base import ChildProcess

FRAME_PERIOD_S = 0.02
_BURST_MEAN_GAP_S = 20.0
_LAG_ALPHA = FRAME_PERIOD_S / 0.3
_NOISE = (lambda rng: [rng.gauss(0.0, 1.0) for _ in range(4099)])(random.Random(7))
_MAX_CLIENT_BACKLOG = 4 << 20
"""A client that lets this much pile up unread is dropped (as a meter would)."""
_MAX_CATCH_UP_S = 1.0
REPO_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("jobscope.simulators.wattmetre")


@dataclass(frozen=True)
class MeterSpec:
    name: str
    port: int = 0
    """TCP port on the host; 0: any free port (see `ports`), or none with --stdout."""
    version: int = 2
    channels: int = 24

    def __post_init__(self) -> None:
        if self.version not in (2, 3):
            raise ValueError(f"{self.name}: version {self.version}: 2 or 3")
        if not 1 <= self.channels <= 256:
            raise ValueError(f"{self.name}: {self.channels} channels: 1-256")
        if not self.name or any(c in self.name for c in ":, \n"):
            raise ValueError(f"meter name {self.name!r}: no ':', ',' or spaces")

    @property
    def arg(self) -> str:
        return f"{self.name}:{self.port or ''}:{self.version}:{self.channels}"

    @classmethod
    def parse(cls, text: str) -> MeterSpec:
        """NAME:PORT:VERSION:CHANNELS (PORT empty with --stdout)."""
        parts = text.split(":")
        if len(parts) != 4:
            raise ValueError(f"{text!r}: NAME:PORT:VERSION:CHANNELS")
        name, port, version, channels = parts
        return cls(name, int(port or 0), int(version), int(channels))


def numbered(count: int, first_port: int, version: int = 2, channels: int = 24) -> list[MeterSpec]:
    """wattmetre1..N on ports first_port..first_port+N-1."""
    return [MeterSpec(f"wattmetre{i + 1}", first_port + i, version, channels) for i in range(count)]


class Channel:
    """One port's power: idle, bursts, a lag between levels, noise."""

    __slots__ = ("idle", "level", "next_change", "noise_at", "rng", "target")

    def __init__(self, seed: int, meter: str, channel: int) -> None:
        self.rng = random.Random(zlib.crc32(f"{seed}/{meter}/{channel}".encode()))
        self.idle = self.rng.uniform(90.0, 120.0)
        self.level = self.target = self.idle
        self.next_change = 0.0
        self.noise_at = self.rng.randrange(len(_NOISE))

    def value(self, t: float) -> float:
        if t >= self.next_change:
            if self.target == self.idle and self.next_change:
                self.target = self.rng.uniform(200.0, 300.0)
                self.next_change = t + self.rng.uniform(2.0, 15.0)
            else:
                self.target = self.idle
                self.next_change = t + self.rng.expovariate(1 / _BURST_MEAN_GAP_S)
        self.level += (self.target - self.level) * _LAG_ALPHA
        self.noise_at = (self.noise_at + 1) % len(_NOISE)
        return self.level * (1.0 + 0.01 * _NOISE[self.noise_at])


class Meter:
    """One wattmeter: its channels, its frames, its clients and what the control port did."""

    def __init__(self, spec: MeterSpec, seed: int, malformed_rate: float = 0.0) -> None:
        self.spec = spec
        self.channels = [Channel(seed, spec.name, i) for i in range(spec.channels)]
        self.counter = 0
        self.malformed_rate = malformed_rate
        self.stopped = False
        self.port = 0
        """The port it listens on (its spec's, or the one it took)."""
        self.clients: set[asyncio.Transport] = set()
        self.server: asyncio.Server | None = None
        self._rng = random.Random(zlib.crc32(f"{seed}/{spec.name}/faults".encode()))

    def frame(self, t: float) -> bytes:
        """The frame of the sample at `t` (s); malformed with probability `malformed_rate`."""
        self.counter += 1
        powers = [channel.value(t) for channel in self.channels]
        if self.spec.version == 2:
            line = f"{self.spec.name},{self.counter},{t:.3f},OK," + ",".join(
                [f"{p:.2f}" for p in powers]
            )
        else:
            volts = 230.0 + 2.0 * math.sin(t / 7.0)
            fields = [f"{t:.3f}", "true", str(self.counter), f"{volts:.1f}", "50.00", "0"]
            for p in powers:
                fields += (f"{p:.2f}", f"{p / volts:.3f}")
            total = sum(powers)
            fields += (f"{total:.2f}", f"{total / volts:.3f}", "0", "0", "0")
            line = ",".join(fields)
        if self.malformed_rate and self._rng.random() < self.malformed_rate:
            line = self._malformed(line)
        return line.encode() + b"\n"

    def _malformed(self, line: str) -> str:
        """One of the ways a frame goes wrong: cut short, a bad number, a bad flag."""
        fields = line.split(",")
        kind = self._rng.randrange(3)
        if kind == 0:
            return line[: self._rng.randrange(1, max(2, len(line) // 3))]
        if kind == 1:
            fields[-1 if self.spec.version == 2 else 6] = "12x.4"
            return ",".join(fields)
        fields[3 if self.spec.version == 2 else 1] = "KO" if self.spec.version == 2 else "false"
        return ",".join(fields)

    def garbage(self) -> bytes:
        junk = bytes(self._rng.randrange(256) for _ in range(300))
        return junk + b"\n"

    def send(self, data: bytes) -> None:
        for client in list(self.clients):
            if client.get_write_buffer_size() > _MAX_CLIENT_BACKLOG:
                log.warning("%s: dropping a client that does not read", self.spec.name)
                client.abort()
                self.clients.discard(client)
            else:
                client.write(data)


class _Client(asyncio.Protocol):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.meter.clients.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.meter.clients.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        """Meters do not listen: what clients send is ignored."""


def ticks(start: float) -> Iterator[float]:
    """Sample times: multiples of FRAME_PERIOD_S from `start` (rounded up)."""
    k = math.ceil(start / FRAME_PERIOD_S)
    while True:
        yield round(k * FRAME_PERIOD_S, 3)
        k += 1


class Simulator:
    """The meters of one process, their ticker and their control port."""

    def __init__(self, meters: list[Meter], host: str) -> None:
        self.meters = {meter.spec.name: meter for meter in meters}
        self.host = host

    async def listen(self, meter: Meter) -> None:
        loop = asyncio.get_running_loop()
        port = meter.port or meter.spec.port  # the same port again after `close`
        meter.server = await loop.create_server(
            lambda: _Client(meter), self.host, port, reuse_address=True
        )
        meter.port = meter.server.sockets[0].getsockname()[1]

    def ports(self) -> dict[str, int]:
        return {name: meter.port for name, meter in self.meters.items()}

    async def run(self, control_port: int | None, stop: asyncio.Event) -> None:
        for meter in self.meters.values():
            await self.listen(meter)
        control = None
        if control_port:
            control = await asyncio.start_server(self._control, self.host, control_port)
        log.info(
            "serving %s%s",
            ", ".join(
                f"{m.spec.name} (v{m.spec.version}, {m.spec.channels} channels) on "
                f"{self.host}:{m.port}"
                for m in self.meters.values()
            ),
            f"; control on {self.host}:{control_port}" if control_port else "",
        )
        ticker = asyncio.create_task(self._tick())
        await stop.wait()
        ticker.cancel()
        for meter in self.meters.values():
            for client in list(meter.clients):
                client.abort()
            if meter.server is not None:
                meter.server.close()
        if control is not None:
            control.close()

    async def _tick(self) -> None:
        times = ticks(time.time())
        t = next(times)
        while True:
            delay = t - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > _MAX_CATCH_UP_S:  # too far behind: skip to now, as a meter would
                times = ticks(time.time())
                t = next(times)
                continue
            for meter in self.meters.values():
                if meter.clients and not meter.stopped:
                    meter.send(meter.frame(t))
            t = next(times)

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    answer = await self.command(line.decode().split())
                    writer.write(f"ok{' ' + answer if answer else ''}\n".encode())
                except (ValueError, KeyError, OSError) as exc:
                    writer.write(f"error: {exc}\n".encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def command(self, words: list[str]) -> str | None:
        """Run one control command (see the module docstring); ValueError if unknown."""
        if words == ["ping"]:
            return None
        if words == ["ports"]:
            return " ".join(f"{name}:{port}" for name, port in self.ports().items())
        if len(words) < 2:
            raise ValueError("command NAME [ARG]: stop, resume, close, reset, malformed, garbage")
        verb, name, *rest = words
        if name not in self.meters:
            raise KeyError(f"no meter {name!r}")
        meter = self.meters[name]
        log.info("control: %s", " ".join(words))
        if verb == "stop":
            meter.stopped = True
        elif verb == "resume":
            meter.stopped = False
            if meter.server is None:
                await self.listen(meter)
        elif verb == "close":
            if meter.server is not None:
                meter.server.close()
                meter.server = None
            for client in list(meter.clients):
                client.close()
        elif verb == "reset":
            for client in list(meter.clients):
                sock = client.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.abort()
        elif verb == "malformed" and len(rest) == 1 and 0 <= float(rest[0]) <= 1:
            meter.malformed_rate = float(rest[0])
        elif verb == "garbage":
            meter.send(meter.garbage())
        else:
            raise ValueError(f"unknown command {' '.join(words)!r}")


def write_stdout(meter: Meter, duration_s: float) -> int:
    """Frames of `meter` on standard output at 50 Hz, for `duration_s` (0: until stopped)."""
    out = sys.stdout.buffer
    end = time.time() + duration_s if duration_s else math.inf
    times = ticks(time.time())
    try:
        while (t := next(times)) <= end:
            delay = t - time.time()
            if delay > 0:
                time.sleep(delay)
            elif -delay > _MAX_CATCH_UP_S:  # too far behind: skip to now, as a meter would
                times = ticks(time.time())
                continue
            out.write(meter.frame(t))
            out.flush()
    except BrokenPipeError:  # the reader went away: no second error when Python exits
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


class Wattmetres(ChildProcess):
    """`python -m stack.simulators.wattmetre` as a child process, and its control port."""

    def __init__(
        self,
        state_dir: Path,
        meters: Sequence[MeterSpec],
        control_port: int,
        host: str = "127.0.0.1",
        seed: int = 1,
        malformed_rate: float = 0.0,
    ) -> None:
        if not meters:
            raise ValueError("no meters")
        self.state_dir = Path(state_dir)
        self.meters = list(meters)
        self.control_port = control_port
        self.host = host
        self.seed = seed
        self.malformed_rate = malformed_rate
        self.log_file = self.state_dir / "wattmetre.log"

    def __repr__(self) -> str:
        first, last = self.meters[0], self.meters[-1]
        span = f"{first.port}" if len(self.meters) == 1 else f"{first.port}..{last.port}"
        return f"Wattmetres({len(self.meters)} on {self.host}:{span}, pid={self.pid})"

    def start(self, timeout: float = 30.0) -> None:
        """Start the meters and wait until each accepts connections."""
        if self.pid is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "stack.simulators.wattmetre",
            "--host",
            self.host,
            "--control-port",
            str(self.control_port),
            "--seed",
            str(self.seed),
            "--malformed-rate",
            str(self.malformed_rate),
        ]
        for meter in self.meters:
            argv += ["--meter", meter.arg]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # `-m` from any directory
        self._spawn(argv, self._ready, timeout, f"listen on {self!r}", env)

    def _ready(self) -> bool:
        """Every meter accepts connections (those given port 0: on the port they took)."""
        try:
            answer = self.control("ports", timeout=1.0)
        except (OSError, RuntimeError):
            return False
        ports = dict(item.split(":") for item in answer.split())
        self.meters = [replace(meter, port=int(ports[meter.name])) for meter in self.meters]
        return all(_accepts(self.host, meter.port) for meter in self.meters)

    def control(self, *words: str, timeout: float = 5.0) -> str:
        """Send one command (see the module docstring) and return what follows its `ok`;
        RuntimeError if it is refused."""
        with socket.create_connection((self.host, self.control_port), timeout) as sock:
            sock.sendall(" ".join(words).encode() + b"\n")
            answer = sock.makefile("rb").readline().decode().strip()
        if answer != "ok" and not answer.startswith("ok "):
            raise RuntimeError(f"wattmetre simulator refused {' '.join(words)!r}: {answer}")
        return answer[3:]

    @staticmethod
    def stdout_argv(
        spec: MeterSpec, seed: int = 1, malformed_rate: float = 0.0, duration_s: float = 0.0
    ) -> list[str]:
        """The command writing `spec`'s frames on its standard output (the command form),
        from any working directory."""
        return [
            "/usr/bin/env",
            f"PYTHONPATH={REPO_ROOT}",
            sys.executable,
            "-m",
            "stack.simulators.wattmetre",
            "--stdout",
            "--meter",
            spec.arg,
            "--seed",
            str(seed),
            "--malformed-rate",
            str(malformed_rate),
            "--duration",
            str(duration_s),
        ]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m stack.simulators.wattmetre", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--meter",
        action="append",
        default=[],
        type=MeterSpec.parse,
        help="NAME:PORT:VERSION:CHANNELS",
    )
    parser.add_argument("--meters", type=int, default=0, help="N meters wattmetre1..N")
    parser.add_argument("--port", type=int, default=0, help="with --meters: the first port")
    parser.add_argument("--version", type=int, default=2, choices=(2, 3))
    parser.add_argument("--channels", type=int, default=24)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--malformed-rate", type=float, default=0.0, help="share of frames")
    parser.add_argument("--stdout", action="store_true", help="one meter's frames on stdout")
    parser.add_argument("--duration", type=float, default=0.0, help="--stdout: seconds (0: ever)")
    args = parser.parse_args(argv)
    if args.meters:
        if not args.port and not args.stdout:
            parser.error("--meters needs --port")
        args.meter += numbered(args.meters, args.port, args.version, args.channels)
    if not args.meter:
        parser.error("no meter: --meter NAME:PORT:VERSION:CHANNELS or --meters N --port P")
    if args.stdout and len(args.meter) != 1:
        parser.error("--stdout writes the frames of one meter")
    if not 0 <= args.malformed_rate <= 1:
        parser.error("--malformed-rate: between 0 and 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    meters = [Meter(spec, args.seed, args.malformed_rate) for spec in args.meter]
    if args.stdout:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        return write_stdout(meters[0], args.duration)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await Simulator(meters, args.host).run(args.control_port or None, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

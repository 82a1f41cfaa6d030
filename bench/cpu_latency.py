"""The CPUs' wake-up latency during a benchmark: a Linux CPU latency QoS request.

On this machine (a virtual machine with 2 vCPUs, cpuidle driver `haltpoll`: its idle
states are `POLL` and `haltpoll idle`, a halt of the vCPU) an idle vCPU halts, and waking
it for the next packet or thread hand-over costs the hypervisor's round trip: one
sequential client's `SELECT 1` to the local MariaDB took 56 µs at p50 with the CPUs left
to idle and 16 µs with a request of 0 µs held (2026-12-07, `bench/reads.py`'s C API
client). Every round trip between two processes or threads that wait for each other
pays it, on both sides: a client and its database server, Flink's task thread and the
Python interpreter's other threads.

A program lowers the latency the idle states may add by writing a 32-bit integer (µs)
to `/dev/cpu_dma_latency` and keeping the file open; the request ends when the file is
closed (Linux, Documentation/power/pm_qos_interface.rst, "CPU latency QoS"). tuned's
`latency-performance` profile holds 1–3 µs there (`force_latency`), `cyclictest` 0 by
default. With 0 the idle CPUs poll instead of halting: they burn their own cycles, not
the other CPU's.

The benchmark parts that report with and without it say so in their tables. The
request changes no server's configuration (MariaDB's included) and ends with the
process that holds it.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

#: Linux's CPU latency QoS interface (needs root).
DEVICE = "/dev/cpu_dma_latency"


def available() -> bool:
    """Whether this process may hold a request (the device exists and is writable)."""
    return os.path.exists(DEVICE) and os.access(DEVICE, os.W_OK)


def idle_states() -> list[str]:
    """The names of CPU 0's idle states (`POLL`, `haltpoll idle`, `C1`, …), empty where
    cpuidle is absent."""
    base = "/sys/devices/system/cpu/cpu0/cpuidle"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(base, name, "name")) as f:
                out.append(f.read().strip())
        except OSError:
            continue
    return out


@contextmanager
def held(microseconds: int = 0) -> Iterator[bool]:
    """Hold a CPU latency request of `microseconds` (≥ 0) while the context is open.

    Yields True when the request is held, False where the device is missing or refuses
    it (not writable, or its open or write fails: a container's device rules may refuse
    root too); the context then changes nothing.

    :raises ValueError: `microseconds` is negative or over 2**31 - 1.
    """
    if not 0 <= microseconds <= 2**31 - 1:
        raise ValueError(f"a CPU latency request is ≥ 0 µs and < 2**31, not {microseconds}")
    fd = None
    if available():
        try:
            fd = os.open(DEVICE, os.O_WRONLY)
            os.write(fd, struct.pack("i", microseconds))
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)

"""bench/cpu_latency.py: the CPU latency QoS request the benchmark holds. The kernel's
device is replaced by a file here (what the kernel does with the request is measured in
`make bench`, part 6): the request is written as Linux reads it, a native 32-bit integer,
and ends when the context closes the file."""
import struct

import pytest

from bench import cpu_latency


def test_the_request_is_a_32_bit_integer_held_while_the_context_is_open(tmp_path, monkeypatch):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    monkeypatch.setattr(cpu_latency, "DEVICE", str(device))
    with cpu_latency.held(7) as held:
        assert held is True
        assert struct.unpack("i", device.read_bytes()) == (7,)


def test_without_the_device_nothing_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_latency, "DEVICE", str(tmp_path / "missing"))
    with cpu_latency.held(0) as held:
        assert held is False


def test_a_negative_latency_is_refused():
    with pytest.raises(ValueError, match="≥ 0 µs, not -1"):
        with cpu_latency.held(-1):
            pass

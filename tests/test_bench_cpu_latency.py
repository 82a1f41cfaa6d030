"""bench/cpu_latency.py: the CPU latency QoS request the benchmark holds. The kernel's
device is replaced by a file here (what the kernel does with the request is measured in
`make bench`, part 6): the request is written as Linux reads it, a native 32-bit integer,
and ends when the context closes the file."""
import os
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


def test_the_request_ends_when_the_context_ends_even_by_an_exception(tmp_path, monkeypatch):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    monkeypatch.setattr(cpu_latency, "DEVICE", str(device))

    def open_on_device() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd")
                   if os.path.realpath(f"/proc/self/fd/{fd}") == str(device))
    with pytest.raises(RuntimeError):
        with cpu_latency.held(0):
            assert open_on_device() == 1
            raise RuntimeError("the part failed")
    assert open_on_device() == 0


def test_a_device_that_refuses_the_request_holds_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_latency, "DEVICE", str(tmp_path))  # a folder: open() fails
    monkeypatch.setattr(cpu_latency, "available", lambda: True)
    with cpu_latency.held(0) as held:
        assert held is False


@pytest.mark.parametrize("microseconds", [-1, 2**31])
def test_a_latency_out_of_range_is_refused(microseconds):
    with pytest.raises(ValueError, match=f"not {microseconds}"):
        with cpu_latency.held(microseconds):
            pass

import socket

from worker import ports


def test_the_port_binds_and_lies_below_the_ephemeral_range():
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert ports._LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports.random, "sample", lambda _range, k: [taken] * k)
        port = ports.free_port()
    assert port != taken

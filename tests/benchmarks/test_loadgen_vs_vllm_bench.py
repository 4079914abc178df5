"""The open-streams phase sizes its rounds by requests measured, not by rounds alone."""

from __future__ import annotations

import itertools

from benchmarks.loadgen_vs_vllm_bench import MAX_STREAM_PAIRS, pairs_for


def test_few_streams_run_more_rounds_for_the_same_requests() -> None:
    # One stream: 200 requests need 200 pairs; 32 streams reach 200 within the floor of 6 pairs
    # plus one more (7 x 32 = 224).
    assert pairs_for(1, 6, 200) == 200
    assert pairs_for(8, 6, 200) == 25
    assert pairs_for(32, 6, 200) == 7
    assert all(pairs_for(n, 6, 200) * n >= 200 for n in (1, 2, 3, 8, 32, 64))


def test_the_floor_of_pairs_and_the_cap_hold() -> None:
    assert pairs_for(64, 6, 20) == 6  # the requested pairs, even when fewer would do
    assert pairs_for(1, 6, 10_000) == MAX_STREAM_PAIRS  # bounded, whatever is asked


def test_each_block_runs_every_arm_once_and_every_arm_takes_every_position() -> None:
    """Over four blocks (a Williams square), every arm (ours, the raw reference, ours at the normal
    policy, the raw reference without its lead) runs in each position once and follows each other
    arm exactly once, so no arm always comes after the same one."""
    from benchmarks.loadgen_vs_vllm_bench import ARM_ORDERS, ARMS

    assert len(ARM_ORDERS) == len(ARMS) == 4 and all(sorted(order) == sorted(ARMS) for order in ARM_ORDERS)
    for position in range(len(ARMS)):
        assert sorted(order[position] for order in ARM_ORDERS) == sorted(ARMS)
    followed = [(a, b) for order in ARM_ORDERS for a, b in itertools.pairwise(order)]
    assert len(followed) == len(set(followed)) == len(ARMS) * (len(ARMS) - 1)


def test_the_reference_sends_as_long_after_connecting_as_our_client_does() -> None:
    from benchmarks.loadgen_vs_vllm_bench import REFERENCE_LEAD_S
    from serving.loadgen.runner import START_LEAD_S

    assert REFERENCE_LEAD_S == START_LEAD_S > 0


def test_an_arms_figures_pool_its_rounds() -> None:
    from benchmarks.loadgen_vs_vllm_bench import _arm_figures

    figures = _arm_figures([[10.0, 30.0], [20.0]], {"fifo"}, [12.0, 14.0])
    assert figures == {
        "scheduling": ["fifo"],
        "num_measured": 3,
        "p50_ttft_ms": 20.0,
        "p95_ttft_ms": 29.0,
        "engine_mean_ttft_ms": 13.0,
    }
    spread = _arm_figures([[10.0]], {"fifo"}, [12.0], [[0.0, 4.0, 1.0], [0.0, 2.0], [0.0, 9.0]])
    assert spread["send_spread_ms_median"] == 4.0  # the median round's first-to-last send


def test_a_reference_client_reports_its_first_token_and_reads_the_rest_only_when_released() -> None:
    """A raw client against a local server that streams one event, then (once the client has
    reported) the rest: the client's report comes with the first event, it then reads nothing
    until released, and after release it reads the stream to its end and hangs up."""
    import queue
    import socket
    import threading

    from benchmarks.loadgen_vs_vllm_bench import _raw_stream_client

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    reported = threading.Event()
    served: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request, in one write
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
            conn.sendall(b'data: {"id":"x","choices":[{"text":"a"}]}\n\n')
            served["reported_in_time"] = reported.wait(timeout=30)
            conn.sendall(b'data: {"id":"x","choices":[{"text":"b"}]}\n\ndata: [DONE]\n\n')
            conn.shutdown(socket.SHUT_WR)
            served["closed_by_client"] = conn.recv(1) == b""

    server = threading.Thread(target=serve)
    server.start()
    barrier = threading.Barrier(2)
    results: queue.Queue[tuple[int, object, str, float | None]] = queue.Queue()
    release = threading.Event()
    client = threading.Thread(
        target=_raw_stream_client,
        args=("127.0.0.1", port, b"{}", barrier, results, 7, 0.0, release),
    )
    client.start()
    barrier.wait(timeout=30)
    index, ttft, _policy, sent = results.get(timeout=30)
    reported.set()
    assert index == 7 and isinstance(ttft, float) and ttft >= 0.0 and isinstance(sent, float)
    client.join(timeout=0.5)
    assert client.is_alive()  # held on `release`, the rest of the stream unread
    release.set()
    client.join(timeout=30)
    server.join(timeout=30)
    listener.close()
    assert not client.is_alive() and served == {"reported_in_time": True, "closed_by_client": True}
    assert results.empty()  # one report per request, none from the drain

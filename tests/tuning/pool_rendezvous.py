"""A stand-in engine for the pool tests: it proves that trials run at once on different hosts.

Each copy (one per trial, started by an agent's trial as its engine command) leaves a marker in
TAILGUARD_TEST_RENDEZVOUS and waits until TAILGUARD_TEST_RENDEZVOUS_N markers are there: only
engines started at the same time all see them. It then exits with status 3 (the trial fails to
start its engine, which is all the test needs: no vLLM, no measurement); one that waited in vain
exits with status 4, which the test would see in the trial's error. Nothing here is timed: the
wait is an upper bound, never a condition the test relies on.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

MET, ALONE = 3, 4


def main() -> int:
    folder = Path(os.environ["TAILGUARD_TEST_RENDEZVOUS"])
    expected = int(os.environ.get("TAILGUARD_TEST_RENDEZVOUS_N", "2"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"engine-{os.getpid()}").write_text(" ".join(sys.argv[1:]))
    deadline = time.monotonic() + float(os.environ.get("TAILGUARD_TEST_RENDEZVOUS_WAIT_S", "300"))
    while time.monotonic() < deadline:
        if len(list(folder.glob("engine-*"))) >= expected:
            print(f"rendezvous: {expected} engines started together", flush=True)
            return MET
        time.sleep(0.2)
    print("rendezvous: no other engine started while this one waited", flush=True)
    return ALONE


if __name__ == "__main__":
    sys.exit(main())

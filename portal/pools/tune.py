"""`tailguard tune --pool NAME`, on the portal's side: the library's command hands over here
(tuning/commands/tune.py), since reaching a pool's hosts takes the portal's database (which
hosts are live) and broker (the pool's queue). The command line is the library's own; only where
the trials run changes (portal/pools/trials.py).

An operator's tool: it reads the pool by name from the database it is given (DATABASE_URL), as
`tailguard agent` does, without an organization's residency rules (the portal's jobs apply them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

PROG = "tailguard tune"


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.db import DatabaseError

    from portal.pools import selectors
    from portal.pools.models import Pool
    from portal.pools.trials import PoolExecutor, PoolUnavailable
    from tuning.commands import tune

    parser = argparse.ArgumentParser(prog="tailguard")
    tune.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *(sys.argv[1:] if argv is None else argv)])
    name = str(args.pool or "").strip()
    try:
        pool = Pool.objects.filter(name=name).first()
        if pool is None:
            known = ", ".join(Pool.objects.filter(enabled=True).values_list("name", flat=True))
            print(f"{PROG}: no pool named {name!r}; known: {known or 'none'}", file=sys.stderr)
            return 2
        if not pool.enabled:
            print(f"{PROG}: pool {name!r} is disabled", file=sys.stderr)
            return 2
        if args.hardware and args.hardware != pool.accelerator:
            print(
                f"{PROG}: pool {name} is {pool.accelerator}, not {args.hardware} (leave --hardware out: "
                "the pool decides it)",
                file=sys.stderr,
            )
            return 2
        waiting = selectors.pool_waiting_reason(pool=pool)
        if waiting:
            print(f"{PROG}: pool {name} has no live host: {waiting}", file=sys.stderr)
            return 1
        price = pool.price_per_host_hour_usd or 0.0  # 0: the pool is not priced
        executor = PoolExecutor(pool, log=lambda line: print(line, file=sys.stderr))
        print(f"[tailguard tune] trials on pool {name} ({pool.accelerator})", file=sys.stderr)
        return tune.run(args, executor=executor, hardware=pool.accelerator, price_per_hour_usd=price)
    except PoolUnavailable as exc:
        print(f"{PROG}: {exc} (run the same command again to resume)", file=sys.stderr)
        return 1
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{PROG}: cannot reach the portal's database (DATABASE_URL): {first}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

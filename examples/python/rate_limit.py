#!/usr/bin/env python3
"""A shared rate limit over CounterService: at most LIMIT hits per WINDOW on
one counter, whichever process or replica asks. A retried hit (same
request_id) is answered again, never counted twice.

    /usr/bin/python3 examples/python/rate_limit.py --addr 127.0.0.1:7070
"""

import argparse
import sys
import uuid

import grpc
from google.protobuf import duration_pb2

from coordinator.v1 import counter_pb2, counter_pb2_grpc
from register import say


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7070", help="coordinatord address")
    p.add_argument("--name", default="examples/rate", help="counter name")
    p.add_argument("--limit", type=int, default=3, help="hits allowed per window")
    p.add_argument("--window", type=int, default=60, help="window in seconds (a fixed window, from its first hit)")
    p.add_argument("--tries", type=int, default=5, help="hits to send")
    args = p.parse_args()

    with grpc.insecure_channel(args.addr) as channel:
        counters = counter_pb2_grpc.CounterServiceStub(channel)
        for n in range(args.tries):
            req = counter_pb2.HitRequest(name=args.name, limit=args.limit,
                                         window=duration_pb2.Duration(seconds=args.window),
                                         request_id=uuid.uuid4().hex)
            r = counters.Hit(req, timeout=10)
            say("hit", n=n, allowed=str(r.allowed).lower(), count=r.count, remaining=r.remaining,
                retry_after="%.3fs" % r.retry_after.ToTimedelta().total_seconds())
            if n == 0:
                # The answer was lost, say: the retry carries the same request_id.
                again = counters.Hit(req, timeout=10)
                say("retried", replayed=str(again.replayed).lower(), count=again.count)
        g = counters.Get(counter_pb2.GetRequest(name=args.name), timeout=10)
        say("counter", count=g.count, limit=g.limit)
        reset = counters.Reset(counter_pb2.ResetRequest(name=args.name), timeout=10)
        say("reset", existed=str(reset.existed).lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Acquire a lock with a bounded wait, keep it alive from a background thread,
write to a fenced resource with the token, validate, and release.

    /usr/bin/python3 examples/python/fenced_write.py --addr 127.0.0.1:7070
"""

import argparse
import sys
import time

import grpc

import coord


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7070", help="coordinatord address")
    p.add_argument("--name", default="examples/report", help="lock name")
    p.add_argument("--owner", default="python-example", help="owner shown by Describe")
    p.add_argument("--ttl", type=float, default=5, help="lease TTL, seconds")
    p.add_argument("--wait", default="10",
                   help="how long to wait for the lock, seconds, or 'none' to wait until --deadline")
    p.add_argument("--deadline", type=float, default=30, help="deadline of the Acquire call, seconds")
    p.add_argument("--hold", default="0",
                   help="seconds to hold the lock (kept alive meanwhile), or 'stdin' to hold until stdin closes")
    args = p.parse_args()

    channel, stub = coord.connect(args.addr)
    try:
        wait = None if args.wait == "none" else float(args.wait)
        lease = coord.Lease.acquire(stub, args.name, args.ttl, args.owner, wait=wait, deadline=args.deadline)
    except grpc.RpcError as e:
        # ABORTED, reason LOCK_HELD: still held after --wait (the holder's
        # token is in the ErrorInfo's metadata); DEADLINE_EXCEEDED: --deadline
        # came first.
        why, metadata = coord.error_info(e)
        coord.say("not-acquired", name=args.name, code=e.code().name, reason=why or "none",
                  holder=metadata.get("holderToken", "none"))
        return 2
    coord.say("acquired", name=args.name, token=lease.token, ttl="%gs" % lease.ttl)
    lease.keep_alive()

    register = coord.FencedRegister(stub, args.name)
    register.write(lease.token, "report by %s" % args.owner)
    coord.say("wrote", token=lease.token)

    if args.hold == "stdin":
        sys.stdin.read()
    else:
        time.sleep(float(args.hold))
    if lease.lost.is_set():
        coord.say("stopped", reason="lease lost")
        return 3

    v = stub.ValidateToken(coord.pb.ValidateTokenRequest(name=args.name, token=lease.token), timeout=10)
    coord.say("validated", token=lease.token, valid=v.valid, reason=coord.reason(v.reason), current=v.current_token)
    register.write(lease.token, "report by %s, final" % args.owner)
    coord.say("wrote", token=lease.token)

    coord.say("released", token=lease.token, released=lease.release())
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

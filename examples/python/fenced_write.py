#!/usr/bin/env python3
"""Acquire a lock with a bounded wait (one request_id across retries), keep it
alive from a background thread, write to a fenced resource with the token,
validate, and release. Work stops if the lease is lost or safe_until passes.

    /usr/bin/python3 examples/python/fenced_write.py --addr 127.0.0.1:7070
"""

import argparse
import sys
import time

import coordinatord
from register import FencedRegister, reason, say


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7070", help="coordinatord address")
    p.add_argument("--name", default="examples/report", help="lock name")
    p.add_argument("--owner", default="python-example", help="owner shown by Describe")
    p.add_argument("--ttl", type=float, default=5, help="lease TTL, seconds")
    p.add_argument("--wait", default="10",
                   help="how long to wait for the lock, seconds, or 'none' to wait until --deadline")
    p.add_argument("--deadline", type=float, default=30, help="deadline of the acquisition, retries included, seconds")
    p.add_argument("--hold", default="0",
                   help="seconds to hold the lock (kept alive meanwhile), or 'stdin' to hold until stdin closes")
    args = p.parse_args()

    client = coordinatord.Client(args.addr)
    try:
        wait = None if args.wait == "none" else float(args.wait)
        lease = client.acquire(
            args.name, ttl=args.ttl, owner=args.owner, wait=wait, deadline=args.deadline,
            on_renew_error=lambda err: say("keepalive-error", code=err.code.name, reason=err.reason or "none"))
    except coordinatord.LockHeld as e:
        # ABORTED, reason LOCK_HELD: still held after --wait.
        say("not-acquired", name=args.name, code=e.code.name, reason=e.reason, holder=e.holder_token)
        return 2
    except coordinatord.CoordinatorError as e:
        # DEADLINE_EXCEEDED: --deadline came first; anything else by reason.
        say("not-acquired", name=args.name, code=e.code.name, reason=e.reason or "none", holder="none")
        return 2
    say("acquired", name=args.name, token=lease.token, ttl="%gs" % lease.ttl)

    with lease:
        try:
            lease.check()
            register = FencedRegister(client, args.name)
            register.write(lease.token, "report by %s" % args.owner)
            say("wrote", token=lease.token)

            if args.hold == "stdin":
                sys.stdin.read()
            else:
                time.sleep(float(args.hold))

            lease.check()
            v = client.validate(args.name, lease.token)
            say("validated", token=lease.token, valid=v.valid, reason=reason(v.reason), current=v.current_token)
            lease.check()
            register.write(lease.token, "report by %s, final" % args.owner)
            say("wrote", token=lease.token)
        except coordinatord.LeaseLost as e:
            say("stopped", reason=e.reason)
            return 3
        released = lease.release()
    say("released", token=lease.token, released=released)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What happens to a stale token: holder A stops renewing (think of a long GC
pause), its lease expires, B gets the lock with a greater token, and A's late
write is refused by the fenced resource (ValidateToken: REASON_SUPERSEDED).
A's own check() would have stopped it: its safe_until passed unrenewed.

    /usr/bin/python3 examples/python/stale_token.py --addr 127.0.0.1:7070
"""

import argparse
import sys

import coordinatord
from register import FencedRegister, StaleToken, reason, say


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7070", help="coordinatord address")
    p.add_argument("--name", default="examples/stale", help="lock name")
    args = p.parse_args()

    client = coordinatord.Client(args.addr)
    register = FencedRegister(client, args.name)

    # A takes the lock with the shortest TTL etcd grants and, paused, never renews it.
    a = client.acquire(args.name, ttl=2, owner="python-a", wait=10, keep_alive=False)
    say("acquired", who="a", token=a.token, ttl="%gs" % a.ttl)
    register.write(a.token, "from a")
    say("wrote", who="a", token=a.token)
    say("paused", who="a")

    # B waits in the queue and is granted once A's lease expires.
    b = client.acquire(args.name, ttl=10, owner="python-b", wait=20)
    say("acquired", who="b", token=b.token, ttl="%gs" % b.ttl)
    register.write(b.token, "from b")
    say("wrote", who="b", token=b.token)

    # A wakes up. Its token is no longer the current holder's...
    v = client.validate(args.name, a.token)
    say("validated", who="a", token=a.token, valid=v.valid, reason=reason(v.reason), current=v.current_token)
    # ...so the resource refuses its late write (A's a.check() would raise
    # LeaseLost SAFE_UNTIL_PASSED: a careful A never gets this far).
    try:
        register.write(a.token, "late write from a")
        say("accepted", who="a", token=a.token)  # never happens
        return 1
    except StaleToken as e:
        say("refused", who="a", token=e.token, reason=e.reason, current=e.current)

    # A's renewal fails and its handle cannot release B's grant.
    try:
        a.renew()
        say("renewed", who="a")  # never happens
        return 1
    except coordinatord.CoordinatorError as e:
        say("keepalive", who="a", code=e.code.name, reason=e.reason or "none")
    say("released", who="a", released=a.release())
    say("released", who="b", released=b.release())
    say("register", value=repr(register.value), high_water=register.high_water)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

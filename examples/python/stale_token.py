#!/usr/bin/env python3
"""What happens to a stale token: holder A stops renewing (think of a long GC
pause), its lease expires, B gets the lock with a greater token, and A's late
write is refused by the fenced resource (ValidateToken: REASON_SUPERSEDED).

    /usr/bin/python3 examples/python/stale_token.py --addr 127.0.0.1:7070
"""

import argparse
import sys

import grpc

import coord


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7070", help="coordinatord address")
    p.add_argument("--name", default="examples/stale", help="lock name")
    args = p.parse_args()

    channel, stub = coord.connect(args.addr)
    register = coord.FencedRegister(stub, args.name)

    # A takes the lock with the shortest TTL etcd grants and, paused, never renews it.
    a = coord.Lease.acquire(stub, args.name, ttl=2, owner="python-a", wait=10)
    coord.say("acquired", who="a", token=a.token, ttl="%gs" % a.ttl)
    register.write(a.token, "from a")
    coord.say("wrote", who="a", token=a.token)
    coord.say("paused", who="a")

    # B waits in the queue and is granted once A's lease expires.
    b = coord.Lease.acquire(stub, args.name, ttl=10, owner="python-b", wait=20)
    coord.say("acquired", who="b", token=b.token, ttl="%gs" % b.ttl)
    b.keep_alive()
    register.write(b.token, "from b")
    coord.say("wrote", who="b", token=b.token)

    # A wakes up. Its token is no longer the current holder's...
    v = stub.ValidateToken(coord.pb.ValidateTokenRequest(name=args.name, token=a.token), timeout=10)
    coord.say("validated", who="a", token=a.token, valid=v.valid, reason=coord.reason(v.reason), current=v.current_token)
    # ...so the resource refuses its late write.
    try:
        register.write(a.token, "late write from a")
        coord.say("accepted", who="a", token=a.token)  # never happens
        return 1
    except coord.StaleToken as e:
        coord.say("refused", who="a", token=e.token, reason=e.reason, current=e.current)

    # A's renewal fails and its handle cannot release B's grant.
    try:
        stub.KeepAlive(coord.pb.KeepAliveRequest(name=args.name, token=a.token, handle=a.handle), timeout=10)
        coord.say("renewed", who="a")  # never happens
        return 1
    except grpc.RpcError as e:
        coord.say("keepalive", who="a", code=e.code().name, reason=coord.error_info(e)[0] or "none")
    coord.say("released", who="a", released=a.release())
    coord.say("released", who="b", released=b.release())
    coord.say("register", value=repr(register.value), high_water=register.high_water)
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A small coordinatord client for the examples.

It uses Debian's python3-grpcio and python3-grpc-tools only. The gRPC stubs are
not committed: load_stubs() generates them from api/coordinator/v1/lock.proto
into a temporary directory at start-up (grpc_tools.protoc, in process) and
removes them at exit.

Lease acquires a lock and keeps it alive from a background thread (KeepAlive
every ttl/3). FencedRegister is the protected resource: it accepts a write
only if ValidateToken says the writer's token is the current holder's, and
never accepts a token lower than one it already accepted.
"""

import atexit
import os
import shutil
import sys
import tempfile
import threading

import grpc
from google.protobuf import duration_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory holding coordinator/v1/lock.proto; override with
# COORDINATORD_PROTO_ROOT when the example is copied out of the repository.
PROTO_ROOT = os.environ.get("COORDINATORD_PROTO_ROOT", os.path.join(HERE, "..", "..", "api"))


def load_stubs():
    """Generate lock_pb2 and lock_pb2_grpc from the proto and import them."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="coordinatord-stubs-")
    atexit.register(shutil.rmtree, out, True)
    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main([
        "grpc_tools.protoc",
        "-I" + PROTO_ROOT,
        "-I" + well_known,
        "--python_out=" + out,
        "--grpc_python_out=" + out,
        "coordinator/v1/lock.proto",
    ])
    if rc != 0:
        sys.exit("protoc failed (exit %d) on %s/coordinator/v1/lock.proto" % (rc, PROTO_ROOT))
    sys.path.insert(0, out)
    from coordinator.v1 import lock_pb2, lock_pb2_grpc  # noqa: E402 (generated above)

    return lock_pb2, lock_pb2_grpc


pb, pb_grpc = load_stubs()



def _varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf):
    """The (field number, value) pairs of a protobuf message's wire bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        yield key >> 3, v


ERROR_INFO = b"type.googleapis.com/google.rpc.ErrorInfo"


def error_info(e):
    """(reason, metadata) of the coordinator's google.rpc.ErrorInfo in an
    RpcError, e.g. ("LOCK_HELD", {"holderToken": "7"}); ("", {}) if none.

    Every coordinatord error carries one (api/coordinator/v1/errors.proto
    lists the reasons): switch on the reason, not on the message. It travels
    in the grpc-status-details-bin trailer, a google.rpc.Status; it is
    decoded by hand here so that the example needs no googleapis package.
    """
    for key, value in e.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        for num, detail in _fields(value):  # Status.details (3): Any
            if num != 3:
                continue
            any_ = dict(_fields(detail))  # type_url (1), value (2)
            if any_.get(1) != ERROR_INFO:
                continue
            reason, domain, metadata = "", "", {}
            for n, v in _fields(any_.get(2, b"")):
                if n == 1:
                    reason = v.decode()
                elif n == 2:
                    domain = v.decode()
                elif n == 3:  # map<string, string> entry: key (1), value (2)
                    entry = dict(_fields(v))
                    metadata[entry.get(1, b"").decode()] = entry.get(2, b"").decode()
            if domain == "coordinatord":
                return reason, metadata
    return "", {}


# The reasons of a KeepAlive refusal that mean the grant is gone.
LOST_REASONS = ("NOT_HELD", "MAX_HOLD_REACHED", "SESSION_NOT_FOUND")


def reason(r):
    """The name of a ValidateTokenResponse.Reason, e.g. REASON_SUPERSEDED."""
    return pb.ValidateTokenResponse.Reason.Name(r)


def say(event, **fields):
    """Print one event line: `event key=value ...`, flushed (tests read it)."""
    parts = [event] + ["%s=%s" % (k, v) for k, v in fields.items()]
    print(" ".join(parts), flush=True)


def connect(addr):
    channel = grpc.insecure_channel(addr)
    return channel, pb_grpc.LockServiceStub(channel)


def duration(seconds):
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class Lease:
    """A granted lock, renewed by KeepAlive from a background thread."""

    def __init__(self, stub, name, grant):
        self.stub = stub
        self.name = name
        self.token = grant.token
        self.handle = grant.handle  # the secret: never print or log it
        self.ttl = grant.ttl.ToNanoseconds() / 1e9
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def acquire(cls, stub, name, ttl, owner, wait=None, deadline=30.0):
        """Acquire `name`; wait=None waits until the call's deadline."""
        req = pb.AcquireRequest(name=name, owner=owner, ttl=duration(ttl))
        if wait is not None:
            req.wait.CopyFrom(duration(wait))
        grant = stub.Acquire(req, timeout=deadline)
        return cls(stub, name, grant)

    def keep_alive(self):
        """Start renewing every ttl/3 until release() or the grant is lost."""
        self._thread = threading.Thread(target=self._renew, name="keepalive", daemon=True)
        self._thread.start()

    def _renew(self):
        while not self._stop.wait(self.ttl / 3):
            try:
                self.stub.KeepAlive(
                    pb.KeepAliveRequest(name=self.name, token=self.token, handle=self.handle),
                    timeout=self.ttl / 3,
                )
            except grpc.RpcError as e:
                why, _ = error_info(e)
                if why in LOST_REASONS:
                    # The grant is gone: whoever works under it must stop now.
                    say("lost", name=self.name, token=self.token)
                    self.lost.set()
                    return
                # UNAVAILABLE, DEADLINE_EXCEEDED: retry at the next tick,
                # while the lease still has time left.
                say("keepalive-error", code=e.code().name, reason=why or "none")

    def release(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        r = self.stub.Release(pb.ReleaseRequest(name=self.name, token=self.token, handle=self.handle), timeout=10)
        return r.released


class StaleToken(Exception):
    def __init__(self, token, reason, current):
        super().__init__("token %d refused: %s (current token %d)" % (token, reason, current))
        self.token, self.reason, self.current = token, reason, current


class FencedRegister:
    """A protected resource: one value, written only under the current token.

    Before accepting a write it asks ValidateToken (the authority), and it
    also keeps the highest token it has accepted (a high-water mark) and
    refuses any lower one, which covers the gap between the check and the
    write.
    """

    def __init__(self, stub, lock_name):
        self.stub = stub
        self.lock_name = lock_name
        self.value = None
        self.high_water = 0
        self._mu = threading.Lock()

    def write(self, token, value):
        with self._mu:
            v = self.stub.ValidateToken(pb.ValidateTokenRequest(name=self.lock_name, token=token), timeout=10)
            if not v.valid:
                raise StaleToken(token, reason(v.reason), v.current_token)
            if token < self.high_water:
                raise StaleToken(token, "BELOW_HIGH_WATER_MARK", self.high_water)
            self.high_water = token
            self.value = value

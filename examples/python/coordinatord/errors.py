"""The coordinator's errors, by reason.

Every coordinatord error carries a google.rpc.ErrorInfo (domain
"coordinatord") whose reason is an ErrorReason of errors.proto without its
ERROR_REASON_ prefix, e.g. LOCK_HELD, with lowerCamel metadata keys, e.g.
holderToken. Switch on the reason, never on the message.

The ErrorInfo travels in the grpc-status-details-bin trailer, a
google.rpc.Status; it is decoded by hand here so that the package needs no
googleapis-common-protos.
"""

import grpc

from coordinator.v1 import errors_pb2

DOMAIN = "coordinatord"

# Every reason the server can send (errors.proto, prefix stripped).
REASONS = frozenset(
    n[len("ERROR_REASON_"):] for n in errors_pb2.ErrorReason.keys() if n != "ERROR_REASON_UNSPECIFIED"
)

# The reasons of a KeepAlive refusal that mean the grant is gone for good.
LOST_REASONS = frozenset({"NOT_HELD", "MAX_HOLD_REACHED", "SESSION_NOT_FOUND"})

# The codes after which the outcome of a call is unknown: retry it, with the
# same request_id for an Acquire.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_ERROR_INFO = b"type.googleapis.com/google.rpc.ErrorInfo"


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


def error_info(e):
    """(reason, metadata) of the coordinator's ErrorInfo in a grpc.RpcError,
    e.g. ("LOCK_HELD", {"holderToken": "7"}); ("", {}) if it has none (an
    error from the transport, not the server)."""
    trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        for num, detail in _fields(value):  # Status.details (3): Any
            if num != 3:
                continue
            any_ = dict(_fields(detail))  # type_url (1), value (2)
            if any_.get(1) != _ERROR_INFO:
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
            if domain == DOMAIN:
                return reason, metadata
    return "", {}


class CoordinatorError(Exception):
    """A refused call: the gRPC code, the ErrorInfo reason ("" when the error
    came from the transport) and its metadata. The RpcError is __cause__."""

    def __init__(self, code, reason, metadata, message):
        super().__init__("%s %s: %s" % (code.name, reason or "(no reason)", message))
        self.code, self.reason, self.metadata = code, reason, metadata

    @classmethod
    def of(cls, e):
        reason, metadata = error_info(e)
        return cls(e.code(), reason, metadata, e.details() or "")


class LockHeld(CoordinatorError):
    """Acquire was not granted within its wait (ABORTED, reason LOCK_HELD)."""

    @property
    def holder_token(self):
        """The current holder's fencing token, or 0 if not sent."""
        return int(self.metadata.get("holderToken", "0") or 0)


class LeaseLost(Exception):
    """The lease can no longer be trusted: stop working under its token.

    reason is the server's (NOT_HELD, MAX_HOLD_REACHED, SESSION_NOT_FOUND),
    "SAFE_UNTIL_PASSED" when no renewal was confirmed in time, or
    "RELEASED" after release()."""

    def __init__(self, name, token, reason):
        super().__init__("lease of %r (token %d) lost: %s" % (name, token, reason))
        self.name, self.token, self.reason = name, token, reason


def wrap(e):
    """The CoordinatorError (or LockHeld) for a grpc.RpcError."""
    err = CoordinatorError.of(e)
    if err.reason == "LOCK_HELD":
        err = LockHeld(err.code, err.reason, err.metadata, e.details() or "")
    return err

"""What the example scripts share: say() and FencedRegister, a protected
resource (not part of the coordinatord package)."""

import threading


def say(event, **fields):
    """Print one event line: `event key=value ...`, flushed (tests read it)."""
    parts = [event] + ["%s=%s" % (k, v) for k, v in fields.items()]
    print(" ".join(parts), flush=True)


def reason(r):
    """The name of a ValidateTokenResponse.Reason, e.g. REASON_SUPERSEDED."""
    from coordinator.v1 import lock_pb2

    return lock_pb2.ValidateTokenResponse.Reason.Name(r)


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

    def __init__(self, client, lock_name):
        self.client = client
        self.lock_name = lock_name
        self.value = None
        self.high_water = 0
        self._mu = threading.Lock()

    def write(self, token, value):
        with self._mu:
            v = self.client.validate(self.lock_name, token)
            if not v.valid:
                raise StaleToken(token, reason(v.reason), v.current_token)
            if token < self.high_water:
                raise StaleToken(token, "BELOW_HIGH_WATER_MARK", self.high_water)
            self.high_water = token
            self.value = value

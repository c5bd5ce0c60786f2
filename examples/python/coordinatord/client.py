"""Client and Lease: acquire a lock safely, keep it alive, stop at safe_until.

The safety model is the Go SDK's (client/client.go):

- One request_id per logical acquisition, sent again on every retry of an
  ambiguous outcome (UNAVAILABLE, DEADLINE_EXCEEDED): the server answers a
  retry with the same grant or the same queue position, never a second one.
- A local deadline, safe_until = (monotonic time just before the request
  that granted or renewed the lease was sent) + TTL - margin, with margin
  max(TTL/10, 500ms), at most TTL/2. It is computed from this machine's
  monotonic clock only, so it holds whatever the server's clock says.
- A background thread renews every third of (TTL - margin). When the server
  says the grant is gone (NOT_HELD, MAX_HOLD_REACHED, SESSION_NOT_FOUND), or
  safe_until passes without a confirmed renewal, Lease.lost is set and
  Lease.check() raises LeaseLost: work under the token must stop then.
"""

import random
import threading
import time
import uuid

import grpc
from google.protobuf import duration_pb2

from coordinator.v1 import lock_pb2, lock_pb2_grpc

from .errors import LOST_REASONS, RETRYABLE_CODES, CoordinatorError, LeaseLost, wrap


def _duration(seconds):
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def margin(ttl):
    """The safety margin subtracted from the TTL: max(ttl/10, 0.5s), at most ttl/2."""
    return min(max(ttl / 10, 0.5), ttl / 2)


class Client:
    """A connection to coordinatord (insecure by default; pass a channel
    built with grpc.secure_channel for TLS)."""

    def __init__(self, target=None, channel=None):
        if channel is None:
            channel = grpc.insecure_channel(target)
        self.channel = channel
        self.stub = lock_pb2_grpc.LockServiceStub(channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def acquire(self, name, ttl, owner="", wait=None, deadline=30.0, attempt_timeout=None,
                request_id=None, keep_alive=True, on_renew_error=None, backoff=0.1,
                limit=0, shared=False):
        """Acquire the lock `name` and return its Lease, renewed in the
        background unless keep_alive=False.

        wait: seconds to wait in the queue (0: try-lock); None waits until
        the deadline. deadline: seconds for the whole acquisition, retries
        included. attempt_timeout: seconds per attempt (None: what is left of
        the deadline). UNAVAILABLE and DEADLINE_EXCEEDED are retried, with
        jittered exponential backoff and always the same request_id (a
        random UUID unless given), while the deadline allows.

        Raises LockHeld (ABORTED, LOCK_HELD: holder_token is the holder's)
        when not granted within `wait`, CoordinatorError otherwise.
        on_renew_error(err) is called with each CoordinatorError of a
        renewal that will be retried.

        limit: a counting semaphore of that many holders (every acquisition
        of the name must ask for the same; the Lease's slot says which
        permit it holds). shared: a read-write lock's reader (without it,
        a writer).
        """
        req = lock_pb2.AcquireRequest(name=name, owner=owner, ttl=_duration(ttl),
                                      request_id=request_id or str(uuid.uuid4()), limit=limit)
        if shared:
            req.mode = lock_pb2.LOCK_MODE_SHARED
        if wait is not None:
            req.wait.CopyFrom(_duration(wait))
        first = time.monotonic()
        end = first + deadline
        delay = backoff
        attempts = 0
        while True:
            attempts += 1
            left = end - time.monotonic()
            timeout = left if attempt_timeout is None else min(left, attempt_timeout)
            try:
                grant = self.stub.Acquire(req, timeout=max(timeout, 0.001))
                break
            except grpc.RpcError as e:
                pause = delay * random.uniform(0.8, 1.2)
                if e.code() not in RETRYABLE_CODES or end - time.monotonic() <= pause:
                    raise wrap(e) from e
                time.sleep(pause)
                delay = min(delay * 2, 2.0)
        lease = Lease(self, name, grant, sent=first, request_id=req.request_id,
                      attempts=attempts, on_renew_error=on_renew_error)
        # After a long wait or retries the bound from the first send may be
        # near: confirm the grant with a renewal before handing it out.
        if time.monotonic() - first > lease.interval:
            try:
                lease.renew()
            except CoordinatorError:
                lease.release()
                raise
        if keep_alive:
            lease.start()
        return lease

    def validate(self, name, token, timeout=10.0):
        """ValidateToken: the ValidateTokenResponse (valid, reason, current_token)."""
        try:
            return self.stub.ValidateToken(lock_pb2.ValidateTokenRequest(name=name, token=token), timeout=timeout)
        except grpc.RpcError as e:
            raise wrap(e) from e


class Lease:
    """A granted lock. Use it as a context manager (released on exit) and
    call check() before each piece of work done under its token."""

    def __init__(self, client, name, grant, sent, request_id, attempts=1, on_renew_error=None):
        self.client = client
        self.name = name
        self.token = grant.token
        self.handle = grant.handle  # the secret: never print or log it
        self.ttl = grant.ttl.ToNanoseconds() / 1e9
        self.resumed = grant.resumed  # a retry got the grant an earlier attempt made
        self.slot = grant.slot  # a semaphore's permit: tokens rise per slot
        self.request_id = request_id
        self.attempts = attempts
        self.margin = margin(self.ttl)
        # Renew three times per safe window.
        self.interval = (self.ttl - self.margin) / 3
        # The event is set once the lease can no longer be trusted.
        self.lost = threading.Event()
        self.lost_reason = ""
        self._safe_until = sent + self.ttl - self.margin
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._on_renew_error = on_renew_error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    @property
    def safe_until(self):
        """time.monotonic() value until which the lease is known to be held."""
        with self._mu:
            return self._safe_until

    def remaining(self):
        """Seconds left before safe_until (negative once passed)."""
        return self.safe_until - time.monotonic()

    def check(self):
        """Raise LeaseLost unless the lease is still safe to work under."""
        if not self.lost.is_set() and self.remaining() <= 0:
            self._lose("SAFE_UNTIL_PASSED")
        if self.lost.is_set():
            raise LeaseLost(self.name, self.token, self.lost_reason)

    def _lose(self, reason):
        with self._mu:
            if not self.lost.is_set():
                self.lost_reason = reason
                self.lost.set()

    def renew(self, timeout=None):
        """One KeepAlive (timeout: seconds, default the renewal interval):
        moves safe_until forward. Raises CoordinatorError; a reason in
        LOST_REASONS also marks the lease lost."""
        sent = time.monotonic()
        if timeout is None:
            timeout = self.interval
        try:
            r = self.client.stub.KeepAlive(
                lock_pb2.KeepAliveRequest(name=self.name, token=self.token, handle=self.handle), timeout=timeout)
        except grpc.RpcError as e:
            err = wrap(e)
            if err.reason in LOST_REASONS:
                self._lose(err.reason)
            raise err from e
        ttl = r.ttl.ToNanoseconds() / 1e9
        with self._mu:
            self._safe_until = max(self._safe_until, sent + ttl - margin(ttl))

    def start(self):
        """Start renewing in the background until release() or loss."""
        self._thread = threading.Thread(target=self._keep_alive, name="keepalive " + self.name, daemon=True)
        self._thread.start()

    def _keep_alive(self):
        while True:
            left = self.remaining()
            if self._stop.wait(max(min(self.interval, left), 0)):
                return
            if self.remaining() <= 0:
                self._lose("SAFE_UNTIL_PASSED")
                return
            try:
                # A renewal answered after safe_until is of no use.
                self.renew(timeout=max(min(self.interval, self.remaining()), 0.05))
            except CoordinatorError as err:
                if self.lost.is_set():
                    return
                if self._on_renew_error is not None:
                    self._on_renew_error(err)

    def stop(self):
        """Stop renewing (the lease then ends at its TTL); idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def release(self, timeout=10.0):
        """Stop renewing and give the grant up. True if this call freed the
        lock; False if it had already ended."""
        self.stop()
        self._lose("RELEASED")
        try:
            r = self.client.stub.Release(
                lock_pb2.ReleaseRequest(name=self.name, token=self.token, handle=self.handle), timeout=timeout)
        except grpc.RpcError as e:
            raise wrap(e) from e
        return r.released

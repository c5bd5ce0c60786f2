"""coordinatord.Client against a real daemon: request_id across retries,
stop at safe_until, errors by reason."""

import threading
import time

import grpc
import pytest

import coordinatord
from coordinator.v1 import lock_pb2


class FakeRpcError(grpc.RpcError):
    """What a lost response or a broken connection looks like to the caller."""

    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "injected by the test"

    def trailing_metadata(self):
        return ()


class LoseFirstAcquireResponse:
    """A stub whose first Acquire reaches the server but whose answer is
    lost (UNAVAILABLE): the outcome is ambiguous, the caller must retry."""

    def __init__(self, stub):
        self._stub = stub
        self.request_ids = []

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def Acquire(self, req, timeout=None):
        self.request_ids.append(req.request_id)
        resp = self._stub.Acquire(req, timeout=timeout)
        if len(self.request_ids) == 1:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
        return resp


class PartitionedKeepAlive:
    """A stub whose renewals never get through (a network partition)."""

    def __init__(self, stub):
        self._stub = stub

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def KeepAlive(self, req, timeout=None):
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)


def describe(client, name):
    return client.stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=10)


def test_acquire_check_release(client, name):
    with client.acquire(name, ttl=5, owner="pytest") as lease:
        lease.check()
        assert lease.token > 0 and lease.ttl == 5
        assert 0 < lease.remaining() <= 5 - coordinatord.margin(5)
        assert describe(client, name).holder.token == lease.token
    with pytest.raises(coordinatord.LeaseLost) as e:
        lease.check()
    assert e.value.reason == "RELEASED"
    assert not describe(client, name).HasField("holder")


def test_keep_alive_moves_safe_until(client, name):
    with client.acquire(name, ttl=2) as lease:
        first = lease.safe_until
        time.sleep(2.5)  # past the first safe_until: only renewals keep it safe
        lease.check()
        assert lease.safe_until > first


def test_retry_after_lost_response_sends_the_same_request_id(client, name):
    flaky = LoseFirstAcquireResponse(client.stub)
    client.stub = flaky
    with client.acquire(name, ttl=5, wait=5) as lease:
        assert len(flaky.request_ids) == 2 and flaky.request_ids[0] == flaky.request_ids[1] == lease.request_id
        # The retry got the grant the lost answer carried, not a second
        # place in the queue behind itself.
        assert lease.attempts == 2 and lease.resumed
        d = describe(client, name)
        assert d.holder.token == lease.token and len(d.waiters) == 0
        lease.check()


def test_retry_after_deadline_exceeded_keeps_one_waiter(client, name):
    holder = client.acquire(name, ttl=5)
    got = {}

    def wait_for_it():
        # No server-side wait: each attempt ends DEADLINE_EXCEEDED after
        # 0.5s and is retried with the same request_id.
        got["lease"] = client.acquire(name, ttl=5, owner="waiter", wait=None, deadline=20, attempt_timeout=0.5)

    t = threading.Thread(target=wait_for_it)
    t.start()
    time.sleep(2)
    waiters = [w for w in describe(client, name).waiters if w.owner == "waiter"]
    assert len(waiters) <= 1, waiters
    assert holder.release()
    t.join(20)
    lease = got["lease"]
    with lease:
        assert lease.attempts > 1 and lease.token > holder.token
        lease.check()


def test_try_lock_of_a_held_lock_is_lock_held(client, name):
    with client.acquire(name, ttl=5) as holder:
        with pytest.raises(coordinatord.LockHeld) as e:
            client.acquire(name, ttl=5, wait=0)
    assert e.value.code == grpc.StatusCode.ABORTED
    assert e.value.reason == "LOCK_HELD" and e.value.reason in coordinatord.REASONS
    assert e.value.holder_token == holder.token


def test_semaphore_admits_its_limit_on_slots_of_their_own(client, name):
    with client.acquire(name, ttl=5, limit=2) as a, client.acquire(name, ttl=5, limit=2) as b:
        assert {a.slot, b.slot} == {0, 1}
        with pytest.raises(coordinatord.LockHeld):
            client.acquire(name, ttl=5, wait=0, limit=2)
        with pytest.raises(coordinatord.CoordinatorError) as e:
            client.acquire(name, ttl=5, wait=0, limit=3)
        assert e.value.reason == "LIMIT_MISMATCH"


def test_readers_share_and_a_writer_waits(client, name):
    with client.acquire(name, ttl=5, shared=True), client.acquire(name, ttl=5, shared=True, wait=0):
        with pytest.raises(coordinatord.LockHeld):
            client.acquire(name, ttl=5, wait=0)


def test_request_id_reused_with_other_parameters(client, name):
    with client.acquire(name, ttl=5, request_id="pytest-request-id-0001"):
        with pytest.raises(coordinatord.CoordinatorError) as e:
            client.acquire(name, ttl=6, request_id="pytest-request-id-0001", deadline=5)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.reason == "REQUEST_ID_REUSED"


def test_check_raises_once_safe_until_passes_unrenewed(client, name):
    lease = client.acquire(name, ttl=2, keep_alive=False)
    with lease:
        lease.check()
        time.sleep(max(lease.remaining(), 0) + 0.05)
        with pytest.raises(coordinatord.LeaseLost) as e:
            lease.check()
        assert e.value.reason == "SAFE_UNTIL_PASSED" and lease.lost.is_set()


def test_lost_when_renewals_fail(client, name):
    errors = []
    client.stub = PartitionedKeepAlive(client.stub)
    lease = client.acquire(name, ttl=2, on_renew_error=errors.append)
    with lease:
        assert lease.lost.wait(5), "lost not set by the keep-alive thread"
        assert lease.lost_reason == "SAFE_UNTIL_PASSED"
        # Set no later than safe_until, and not long before it.
        assert -2 < lease.remaining() <= 0
        assert errors and all(e.code == grpc.StatusCode.UNAVAILABLE for e in errors)
        with pytest.raises(coordinatord.LeaseLost):
            lease.check()


def test_lost_when_the_server_says_not_held(client, name):
    lease = client.acquire(name, ttl=5, keep_alive=False)
    # Ended behind the lease's back (as by ForceRelease or expiry).
    client.stub.Release(lock_pb2.ReleaseRequest(name=name, token=lease.token, handle=lease.handle), timeout=10)
    with pytest.raises(coordinatord.CoordinatorError) as e:
        lease.renew()
    assert e.value.code == grpc.StatusCode.NOT_FOUND and e.value.reason == "NOT_HELD"
    with pytest.raises(coordinatord.LeaseLost) as lost:
        lease.check()
    assert lost.value.reason == "NOT_HELD"
    assert lease.release() is False

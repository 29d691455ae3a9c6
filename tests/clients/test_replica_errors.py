"""Which errors the replica pool retries on another replica."""

import pytest

from control.clients.replicas import replica_gone

KILLED_MID_WRITE = ('AioRpcError: <AioRpcError of RPC that terminated with:\n\tstatus = StatusCode.INTERNAL\n'
                    '\tdetails = "Internal error from Core"\n\tdebug_error_string = "Failed "execute_batch": '
                    '(<grpc._cython.cygrpc.SendMessageOperation object at 0x7f6a491edab0>,)"\n>')


@pytest.mark.parametrize("error", [
    "StatusCode.UNAVAILABLE: failed to connect to all addresses",
    "Connection reset by peer",
    "the stream ended without the final response",
    KILLED_MID_WRITE,  # a write on a stream whose replica was killed (grpc.aio reports it as INTERNAL)
])
def test_a_replica_that_went_away_is_retried(error):
    assert replica_gone(error)


@pytest.mark.parametrize("error", [
    "StatusCode.INVALID_ARGUMENT: max_tokens = 0: must be >= 1",
    "StatusCode.RESOURCE_EXHAUSTED: queue full",
    "StatusCode.INTERNAL: the model failed",  # a server-side failure, not a lost connection
])
def test_a_request_the_server_refused_is_not_retried(error):
    assert not replica_gone(error)

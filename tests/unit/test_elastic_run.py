"""elastic_run: which MXNet errors count as a failed collective (one process)."""
import mxnet as mx
import pytest
from horovod.common.exceptions import HorovodInternalError

from hvdtrain.runtime.elastic_run import collective_errors

# The first line of what every rank printed in the spike when a peer was killed.
FAILED = ("MXNetError: Horovod has been shut down. This was caused by an exception on one "
          "of the ranks or an attempt to allreduce, allgather or broadcast a tensor after "
          "one of the ranks finished execution.")


def test_a_failed_collective_becomes_horovods_internal_error():
    with pytest.raises(HorovodInternalError, match="Horovod has been shut down"):
        with collective_errors():
            raise mx.base.MXNetError(FAILED)


def test_the_programs_own_mxnet_errors_are_not_retried():
    """A rollback would only meet the same error again: it must end the worker."""
    with pytest.raises(mx.base.MXNetError) as caught:
        with collective_errors():
            mx.nd.dot(mx.nd.ones((2, 3)), mx.nd.ones((2, 3))).wait_to_read()  # shapes clash
    assert not isinstance(caught.value, HorovodInternalError)


# Gloo's own errors, as MXNet rewrote them when a peer of hvdtrain's elastic job was killed
# or went silent (each the whole message of an MXNetError seen there).
GLOO_FAILURES = [
    'Traceback (most recent call last):\n  File "Read error [127.0.0.1]", line 61145\n'
    'MXNetError: Connection reset by peer',
    "[/tmp/pip-wheel-x/horovod/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
    "Timed out waiting 10000ms for recv operation to complete",
]


@pytest.mark.parametrize("message", GLOO_FAILURES)
def test_gloos_own_errors_are_failed_collectives_too(message):
    with pytest.raises(HorovodInternalError):
        with collective_errors():
            raise mx.base.MXNetError(message)


def test_the_line_logged_of_an_error_is_its_message_not_a_traceback_header():
    """An elastic reset logs one line of the engine's error: the message, also when MXNet's
    text opens a C++ traceback (its first line alone said only "Traceback ...")."""
    from hvdtrain.runtime.elastic_run import error_summary
    assert error_summary(mx.base.MXNetError(GLOO_FAILURES[0])) == \
        "MXNetError: Connection reset by peer"
    assert error_summary(mx.base.MXNetError(FAILED)) == FAILED
    assert error_summary(mx.base.MXNetError("")) == "MXNetError"

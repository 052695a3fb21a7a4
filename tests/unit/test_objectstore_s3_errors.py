"""How S3 failures map to domain errors: callers retry `UnavailableError`, never a client bug."""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from tba.errors import NotFoundError, UnavailableError
from tba.objectstore.s3 import _translate


def client_error(code: str, status: int) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("code", "status"),
    [("InternalError", 500), ("ServiceUnavailable", 503), ("SlowDown", 503), ("Whatever", 502)],
)
def test_server_side_failures_are_unavailable(code, status):
    assert isinstance(_translate(client_error(code, status), "k"), UnavailableError)


def test_unreachable_endpoint_is_unavailable():
    error = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert isinstance(_translate(error, "k"), UnavailableError)


def test_missing_objects_are_not_found_and_client_errors_pass_through():
    assert isinstance(_translate(client_error("NoSuchKey", 404), "k"), NotFoundError)
    denied = client_error("AccessDenied", 403)
    assert _translate(denied, "k") is denied

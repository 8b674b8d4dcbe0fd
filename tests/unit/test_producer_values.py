"""What ``producers.publish`` refuses before any SQL, on every driver (the checks are shared):
a content type that is no media type (RFC 2046). tests/integration/test_producers.py runs one
of each through every driver."""

from __future__ import annotations

import pytest

from producers._arguments import _payload_params
from tests.unit.test_cloudevents_attributes import BAD_MEDIA_TYPES, GOOD_MEDIA_TYPES


@pytest.mark.parametrize("content_type", [t for t in BAD_MEDIA_TYPES if "\x00" not in t])
def test_a_content_type_that_is_no_media_type_is_refused(content_type: str) -> None:
    with pytest.raises(ValueError, match=r"content_type .* e\.g\. application/x-protobuf") as caught:
        _payload_params(b"x", content_type)
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)


@pytest.mark.parametrize("content_type", GOOD_MEDIA_TYPES)
def test_a_media_type_is_kept_as_written(content_type: str) -> None:
    assert _payload_params(b"x", content_type) == {"payload": b"x", "content_type": content_type}

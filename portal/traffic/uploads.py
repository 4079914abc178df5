"""Upload handling: a size limit enforced while the body streams in, not after."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import StopUpload, TemporaryFileUploadHandler


class LimitedTemporaryFileUploadHandler(TemporaryFileUploadHandler):
    """Streams uploads to a temporary file and stops at `TRAFFIC_UPLOAD_MAX_BYTES`.

    When the limit is crossed the rest of the body is read and discarded, the file is dropped
    and `request.upload_too_large` (and `upload_too_large_field`, the form field) is set, so the
    form can name the field and the limit.
    """

    def __init__(self, request: Any = None) -> None:
        super().__init__(request)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > settings.TRAFFIC_UPLOAD_MAX_BYTES:
            if self.request is not None:
                # Ad-hoc flags on the request, read back with getattr by the view and the parser.
                self.request.upload_too_large = True  # type: ignore[attr-defined]
                self.request.upload_too_large_field = self.field_name  # type: ignore[attr-defined]
            self.file.close()
            raise StopUpload(connection_reset=False)
        return super().receive_data_chunk(raw_data, start)

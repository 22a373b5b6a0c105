"""msgpack request bodies for agents (compact reports)."""

import msgpack
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from wire.protocol import CONTENT_MSGPACK


class MsgpackParser(BaseParser):
    media_type = CONTENT_MSGPACK

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return msgpack.unpackb(stream.read(), raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types for bad bytes
            raise ParseError(f"malformed msgpack: {exc}") from None

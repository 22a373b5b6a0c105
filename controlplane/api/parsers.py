"""Request body parsers: JSON (every endpoint) and msgpack (agents' compact reports).

A body Python's decoders cannot take (nested past the recursion limit, a number past a float)
is a 400 like any other malformed body, never an error from inside the parser."""

import msgpack
from rest_framework import parsers
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


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser (strict: no NaN or Infinity literals), with recursion and overflow
    errors a 400 too (DRF's catches only ValueError)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except (RecursionError, OverflowError) as exc:
            raise ParseError(f"JSON parse error - {type(exc).__name__}") from None

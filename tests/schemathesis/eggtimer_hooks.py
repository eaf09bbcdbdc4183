"""Schemathesis hooks for eggtimer: plugin uploads are raw bytes (`application/wasm`)."""

import schemathesis


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode()

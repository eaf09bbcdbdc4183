"""Schemathesis hooks for eggtimer: plugin uploads are raw bytes (`application/wasm`), and a
"schema-valid request rejected" report is dropped only when the request was not schema-valid."""

import urllib.parse

import jsonschema_rs
import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode()


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    """Keeps every failure but ST202 on a request whose path parameter breaks its own schema.

    Schemathesis 4.32.5 now and then labels a path parameter with a control character positive
    (seen: `GET /v1/schedules/%07%3Bv` for an id whose schema's pattern bars control characters);
    the runner's 400 is what the document promises for it. The parameter is checked here against
    its documented schema, independently of schemathesis' label; any other ST202 still fails."""
    if not isinstance(failure, RejectedPositiveData):
        return True
    for parameter in case.operation.path_parameters:
        schema = parameter.definition.get("schema")
        value = (case.path_parameters or {}).get(parameter.name)
        if isinstance(schema, dict) and isinstance(value, str):
            if not jsonschema_rs.validator_for(schema).is_valid(urllib.parse.unquote(value)):
                return False
    return True

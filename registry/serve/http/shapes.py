"""The value shapes that the request bodies share, written as JSON Schema so that /openapi.json says what the
library accepts (the library still checks them: these patterns only describe its rules). A client generating
requests from the document, such as schemathesis, then sends nothing that the server refuses as malformed."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, WithJsonSchema
from pydantic.json_schema import JsonDict

from registry.data import endpoints
from registry.data.import_models_queries import MAX_NAME, PATH_SUFFIXES

# what Python's str.strip() removes (the library's test for an empty text or an edge space in a name)
SPACE = endpoints.char_class(endpoints.space_chars())
CONTROL = ("\\u0000-\\u001f\\u007f-\\u009f"                    # what a model name may not hold: controls,
           "\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069")     # and the marks that reorder text
NOT_BLANK = f"[^{SPACE}]"                                       # found anywhere: a text that is not all space
# DuckDB's trim(), which the file checks use, removes only the ASCII space
NOT_SPACES = "[^ ]"
MODEL_NAME = (f"^(?![{SPACE}])[^{CONTROL}]*(?<![{SPACE}])"
              + "".join(f"(?<!{re.escape(s)})" for s in PATH_SUFFIXES) + "$")

NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": MODEL_NAME,
               "description": "printable, no space at either end, not ending in a path suffix of the API "
                              f"({', '.join(PATH_SUFFIXES)})"}
def _whole(value):
    """JSON Schema counts 5.0 as an integer: take it as 5 (a strict int field refuses a float)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole)]
ModelName = Annotated[str, WithJsonSchema(NAME_SCHEMA)]
Text = Annotated[str, WithJsonSchema({"type": "string", "pattern": NOT_BLANK,
                                      "description": "a query text: not empty, not only space"})]
QuestionId = Annotated[str, WithJsonSchema({
    "anyOf": [{"type": "string", "pattern": NOT_SPACES}, {"type": "integer"}],
    "description": "the query's id (external id, as in the registry's queries; a number as a CSV holds it is that "
                   "id); a query the registry lacks needs its `text`, else 404"})]
CORRECT = "^ *(0|1|[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]) *$"
Correct = Annotated[str, WithJsonSchema({
    "anyOf": [{"type": "boolean"}, {"type": "integer", "enum": [0, 1]}, {"type": "string", "pattern": CORRECT}],
    "description": "1/0 or true/false (JSON numbers, booleans or strings)"})]
RowText = Annotated[str, WithJsonSchema({"type": "string", "pattern": NOT_SPACES,
                                         "description": "the query's text, for a query the registry does not have "
                                                        "yet"})]
# an uploaded results file (text/csv), as the library reads one: a header, then one row per query
CSV_UPLOAD = "^question_id,correct\n([A-Za-z0-9_.:-]+,[01]\n)+$"
# what data/endpoints.parse_base_url takes: http(s)://host[:port][/path], space at either end stripped
BASE_URL = f"^[{SPACE}]*({endpoints.base_url_regex()})[{SPACE}]*$"
BASE_URL_SCHEMA: JsonDict = {
    "pattern": BASE_URL, "maxLength": endpoints.MAX_URL,
    "description": "an OpenAI-compatible base URL, http(s)://host[:port][/path]: no credentials, query or fragment"}

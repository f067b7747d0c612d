"""The HTTP protocol of ``memgas serve``, in one place: every request and response as a
typed model (pydantic), the route table, the limits, and the error codes with the
exception each one is on both sides.  The server (:mod:`.app`) is built from it, the
client (:mod:`.client`) speaks it, ``/openapi.json`` is generated from it.

Needs pydantic, nothing else of the web stack, and no torch.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr, ValidationError, model_validator)

__all__ = [
    "ApiError", "ERRORS", "CLIENT_EXCEPTIONS", "Limits", "ROUTES", "Route", "route",
    "MAX_BODY_BYTES", "MAX_ID_CHARS", "error_of", "validation_error", "Message",
    "SessionIn", "SessionsIn", "SearchIn", "EvidenceOut", "SearchResultOut", "SearchOut",
    "ConversationOut", "ConversationsPage", "SessionInfo", "SessionsPage", "SessionOut",
    "AddedSession", "AddedOut", "ReplacedOut", "RemovedOut", "ForgottenOut", "CompactedOut",
    "HealthOut", "ReadyOut", "ErrorOut", "session_body", "parse_date", "NotFound",
    "Conflict", "openapi", "check_id",
]

#: request bodies larger than this are refused with 413 (8 MiB)
MAX_BODY_BYTES = 8 << 20
#: conversation and session ids: at most this many characters
MAX_ID_CHARS = 512
#: a search's ``k`` and ``evidence`` at most
MAX_K, MAX_EVIDENCE = 1000, 100


@dataclass(frozen=True)
class Limits:
    """What one client may ask of ``memgas serve`` (``memgas serve --max-...``, ``--...-
    timeout``).  A request over a limit is refused before it costs anything: 413 for a
    body, 431 for its headers, 408 for a request not sent in time, 422 naming the limit
    for a count."""

    #: bytes of a request body
    max_body_bytes: int = MAX_BODY_BYTES
    #: questions of one search
    max_questions: int = 256
    #: sessions of one add
    max_sessions: int = 256
    #: conversations or sessions of one page of a listing (``?limit=`` at most)
    max_page: int = 1000
    #: conversations or sessions of a page when ``?limit=`` is not given
    default_page: int = 100
    #: bytes of a request's headers (request line included)
    max_header_bytes: int = 16 << 10
    #: header lines of a request
    max_headers: int = 100
    #: seconds from a connection's first byte (or the end of the previous request) to
    #: the end of the request's headers
    header_timeout_s: float = 10.0
    #: seconds to receive a request's whole body once its headers are in
    body_timeout_s: float = 30.0
    #: seconds an idle keep-alive connection is kept open
    keep_alive_s: float = 5.0
    #: connections open at once (more are answered 503 and closed)
    max_connections: int = 1000

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                    or not math.isfinite(v):
                raise ValueError(f"Limits.{f.name} must be a positive number, got {v!r}")
        if self.default_page > self.max_page:
            raise ValueError(f"Limits.default_page ({self.default_page}) is over "
                             f"max_page ({self.max_page})")


# ---------------------------------------------------------------------------- values
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: str) -> str:
    if _SURROGATE.search(value):
        raise ValueError("holds a lone UTF-16 surrogate (not valid Unicode text)")
    return value


def _id(value: str) -> str:
    _text(value)
    if _CONTROL.search(value):
        raise ValueError("holds a control character (ids are printable text)")
    return value


def check_id(value: str, what: str) -> None:
    """Refuse (``invalid_value``) an id of a path that the models would refuse in a body:
    empty, longer than :data:`MAX_ID_CHARS`, or holding a control character."""
    if not value:
        raise ApiError("invalid_value", f"{what} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise ApiError("invalid_value", f"{what} is longer than {MAX_ID_CHARS} characters")
    try:
        _id(value)
    except ValueError as e:
        raise ApiError("invalid_value", f"{what} {e}") from None


def parse_date(value: str) -> _dt.datetime:
    """An ISO 8601 / RFC 3339 date or date-time (``2024-05-01``, ``2024-05-01T10:00``,
    ``2024-05-01T10:00:00Z``, ``2024-05-01 10:00:00+02:00``).

    Raises:
        ValueError: anything else.
    """
    s = value.strip()
    try:
        if len(s) == 10:
            return _dt.datetime.combine(_dt.date.fromisoformat(s), _dt.time())
        if len(s) < 16 or s[10] not in "Tt ":
            raise ValueError
        return _dt.datetime.fromisoformat(s.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not an ISO 8601 date (YYYY-MM-DD, or "
                         "YYYY-MM-DDTHH:MM[:SS][Z|+HH:MM])") from None


def _date(value: str) -> str:
    parse_date(value)
    return value


def _session_date(value: str) -> str:
    return value if value == "" else _date(value)


Text = Annotated[StrictStr, AfterValidator(_text)]
NonEmpty = Annotated[StrictStr, Field(min_length=1), AfterValidator(_text)]
Id = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_id)]
IsoDate = Annotated[StrictStr, AfterValidator(_date)]
SessionDate = Annotated[StrictStr, AfterValidator(_session_date)]
Scalar = Union[StrictStr, StrictBool, StrictInt, StrictFloat, None]
Key = Annotated[StrictStr, Field(min_length=1, max_length=128), AfterValidator(_id)]
Metadata = dict[Key, Scalar]


class _Model(BaseModel):
    """A JSON object of the API: unknown fields refused, JSON types strict (a string is
    not a number, 1 is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ---------------------------------------------------------------------------- requests
class Message(_Model):
    """A chat message (what chat APIs and mem0 take)."""

    role: NonEmpty
    content: Text


class SessionIn(_Model):
    """One session to add (or to put in place of the session of its id): ``messages``
    (``{"role", "content"}`` objects or ``"[role]: content"`` strings, paired into turns
    as :meth:`Session.from_messages` does) or ``turns`` (turn texts stored as given)."""

    id: Id
    date: SessionDate = Field("", description="ISO 8601, or '' when unknown")
    messages: Optional[list[Union[Message, Text]]] = Field(None, min_length=1)
    turns: Optional[list[Text]] = Field(None, min_length=1)
    metadata: Optional[Metadata] = None
    summary: Optional[Text] = None
    keywords: Optional[Text] = None

    @model_validator(mode="after")
    def _one_of(self):
        if (self.messages is None) == (self.turns is None):
            raise ValueError("give either 'messages' or 'turns' (one of them)")
        for v in (self.metadata or {}).values():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError("metadata values must be finite")
        return self

    def session(self):
        """The :class:`~memgas_gpu.Session` it describes."""
        from ..data.model import Session

        if self.messages is not None:
            return Session.from_messages(self.id, self.date, [
                m if isinstance(m, str) else {"role": m.role, "content": m.content}
                for m in self.messages])
        return Session(self.id, self.date, tuple(self.turns))


class SessionsIn(_Model):
    """Several sessions added as one write: all of them or none."""

    sessions: list[SessionIn] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self):
        seen: dict = {}
        for j, s in enumerate(self.sessions):
            if s.id in seen:
                raise ValueError(f"sessions[{j}].id {s.id!r} repeats sessions[{seen[s.id]}].id")
            seen[s.id] = j
        return self


class SearchIn(_Model):
    """Questions about one conversation (or one per question): the arguments of
    :meth:`MemoryIndex.search`."""

    conversation_id: Union[Id, list[Id]]
    questions: list[NonEmpty] = Field(min_length=1)
    k: StrictInt = Field(10, ge=1, le=MAX_K)
    method: Optional[StrictStr] = None
    evidence: StrictInt = Field(3, ge=0, le=MAX_EVIDENCE)
    question_date: Optional[IsoDate] = None
    after: Optional[IsoDate] = None
    before: Optional[IsoDate] = None
    metadata: Optional[Metadata] = None
    settings: dict[Key, Union[StrictBool, StrictInt, StrictFloat, StrictStr]] = {}

    @model_validator(mode="after")
    def _check(self):
        if isinstance(self.conversation_id, list) and \
                len(self.conversation_id) != len(self.questions):
            raise ValueError(f"conversation_id: {len(self.conversation_id)} conversation "
                             f"ids for {len(self.questions)} questions (one id, or one per "
                             "question)")
        clash = [k for k in self.settings if k in SearchIn.model_fields
                 or k in ("encoder", "device", "queries")]
        if clash:
            raise ValueError(f"settings.{clash[0]} is not a read-path setting (give it as "
                             "a field of the search itself)")
        return self

    def kwargs(self) -> dict:
        """The keyword arguments of :meth:`MemoryIndex.search` (settings merged in)."""
        out = {"k": self.k, "method": self.method, "evidence": self.evidence,
               "question_date": self.question_date, "after": self.after,
               "before": self.before, "metadata": self.metadata}
        out.update(self.settings)
        return out


# ---------------------------------------------------------------------------- answers
class _Answer(BaseModel):
    """A JSON object the server answers: exactly these fields, finite numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EvidenceOut(_Answer):
    turn: int
    text: Optional[str]
    score: float


class SearchResultOut(_Answer):
    """One question's answer: the sessions (best first), their scores, best turns,
    dates and metadata."""

    conversation_id: str
    session_ids: list[str]
    scores: list[float]
    evidence: list[list[EvidenceOut]]
    dates: list[str]
    metadata: list[dict[str, Scalar]]


class SearchOut(_Answer):
    results: list[SearchResultOut]


class ConversationOut(_Answer):
    """A conversation: its session count and the range of its session dates."""

    id: str
    sessions: int
    first_date: Optional[str] = None
    last_date: Optional[str] = None


class ConversationsPage(_Answer):
    conversations: list[ConversationOut]
    next_cursor: Optional[str] = None


class SessionInfo(_Answer):
    id: str
    date: str
    metadata: dict[str, Scalar]


class SessionsPage(_Answer):
    conversation_id: str
    sessions: list[SessionInfo]
    next_cursor: Optional[str] = None


class SessionOut(SessionInfo):
    turns: Optional[list[str]]


class AddedSession(_Answer):
    id: str
    date: str
    turns: int


class AddedOut(_Answer):
    conversation_id: str
    added: list[AddedSession]


class ReplacedOut(_Answer):
    conversation_id: str
    replaced: AddedSession


class RemovedOut(_Answer):
    conversation_id: str
    removed: str


class ForgottenOut(_Answer):
    forgotten: str


class CompactedOut(_Answer):
    """A compaction: sessions dropped, and that no file of the folder holds them."""

    dropped: int


class HealthOut(_Answer):
    status: Literal["ok"]


class ReadyOut(_Answer):
    status: Literal["ready"]
    conversations: int
    sessions: int
    log_bytes: int


class ErrorDetail(_Answer):
    code: str
    message: str


class ErrorOut(_Answer):
    error: ErrorDetail


# ---------------------------------------------------------------------------- errors
#: error code → (HTTP status, the exception :class:`~memgas_gpu.serve.client.Client`
#: raises: None for :class:`~memgas_gpu.serve.client.ServerError`)
ERRORS: dict = {
    "bad_request": (400, ValueError),     # not JSON, not an object, a bad path
    "unauthorized": (401, None),          # no key, or not a key of this server
    "not_found": (404, KeyError),         # no such conversation or session
    "no_route": (404, None),              # no such route (an older server, a wrong URL)
    "method_not_allowed": (405, None),
    "timeout": (408, None),               # the request was not sent in time
    "conflict": (409, ValueError),        # a session id taken
    "too_large": (413, None),             # a body over the bound
    "headers_too_large": (431, None),     # request headers over the bound
    "invalid_type": (422, TypeError),     # a field of the wrong type
    "invalid_value": (422, ValueError),   # a field with a wrong value, an unknown field
    "internal": (500, None),              # a bug: the server logs it
    "unavailable": (503, None),           # shutting down, or the memory's log failed
}
CLIENT_EXCEPTIONS = {code: exc for code, (_, exc) in ERRORS.items() if exc is not None}


class ApiError(Exception):
    """An error answer: ``code`` (a key of :data:`ERRORS`) and a one-line message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def status(self) -> int:
        return ERRORS[self.code][0]

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class NotFound(KeyError):
    """No such conversation or session (``what``: ``"conversation"`` or
    ``"session"``): 404."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Conflict(ValueError):
    """A write the memory's state refuses (a session id taken, a conversation that holds
    evaluation questions): 409."""


def error_of(e: BaseException) -> ApiError:
    """The answer for an exception of the memory (one table for the server and the Ray
    shards; the client reverses it with :data:`CLIENT_EXCEPTIONS`): Conflict →
    conflict, KeyError → not_found, TypeError → invalid_type, ValueError →
    invalid_value; an ApiError as it is; anything else is a bug (internal)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, Conflict):
        return ApiError("conflict", str(e))
    if isinstance(e, KeyError):
        return ApiError("not_found", str(e.args[0]) if e.args else "not found")
    if isinstance(e, TypeError):
        return ApiError("invalid_type", str(e))
    if isinstance(e, ValueError):
        return ApiError("invalid_value", str(e))
    return ApiError("internal", "internal error (the server logged it)")


_TAG = re.compile(r"^([A-Z]\w*|str|int|float|bool|none|list\[.*\]|dict\[.*\]|"
                  r"function-.*|json-or-python.*|tagged-union.*|union.*)$")


def validation_error(e: ValidationError, what: str = "body") -> ApiError:
    """One line naming the first bad field of a request (``invalid_type`` for a value of
    the wrong JSON type, ``invalid_value`` otherwise); no lone surrogate of the input
    reaches the message."""
    from .._io import replace_surrogates

    err = e.errors(include_url=False)[0]
    parts = [replace_surrogates(str(x)) for x in err["loc"]
             if not (isinstance(x, str) and _TAG.match(x))]
    loc = ".".join(parts)
    kind = err["type"]
    msg = replace_surrogates(str(err["msg"])).removeprefix("Value error, ")
    if kind in ("extra_forbidden", "missing") and parts:
        parent = ".".join(parts[:-1]) or what
        word = "unknown" if kind == "extra_forbidden" else "missing"
        return ApiError("invalid_value", f"{parent}: {word} field {parts[-1][:80]!r}")
    if kind == "string_unicode":
        msg = "not valid Unicode text (a lone UTF-16 surrogate)"
    code = "invalid_type" if kind.endswith("_type") or kind in (
        "model_type", "list_type", "dict_type", "string_unicode") else "invalid_value"
    return ApiError(code, f"{loc}: {msg}" if loc else msg)


# ---------------------------------------------------------------------------- routes
@dataclass(frozen=True)
class Route:
    """One route: ``method``, ``path`` (``{cid}``, ``{sid}``: one percent-encoded path
    segment each), the handler's ``name``, the request and answer models, the status
    of a success, whether it needs a key, and the query parameters it takes."""

    method: str
    path: str
    name: str
    body: Any
    answer: Any
    status: int = 200
    auth: bool = True
    query: tuple = ()
    summary: str = ""


PAGE = ("limit", "cursor")
ROUTES = (
    Route("GET", "/healthz", "healthz", None, HealthOut, auth=False,
          summary="Alive (200 while the server runs)"),
    Route("GET", "/readyz", "readyz", None, ReadyOut, auth=False,
          summary="Ready: the memory is open (what it holds, all tenants together)"),
    Route("GET", "/metrics", "metrics", None, None, auth=False,
          summary="Prometheus metrics (text)"),
    Route("GET", "/v1/conversations", "list_conversations", None, ConversationsPage,
          query=PAGE, summary="This key's conversations, a page at a time"),
    Route("GET", "/v1/conversations/{cid}", "get_conversation", None, ConversationOut,
          summary="One conversation: its session count and dates"),
    Route("DELETE", "/v1/conversations/{cid}", "forget", None, ForgottenOut,
          summary="Forget a conversation (its bytes leave the folder by the next "
                  "compaction)"),
    Route("POST", "/v1/conversations/{cid}/sessions", "add_sessions",
          Union[SessionIn, SessionsIn], AddedOut, 201,
          summary="Add one session, or several as one write (all or none)"),
    Route("GET", "/v1/conversations/{cid}/sessions", "list_sessions", None, SessionsPage,
          query=PAGE, summary="A conversation's sessions, a page at a time"),
    Route("GET", "/v1/conversations/{cid}/sessions/{sid}", "get_session", None, SessionOut,
          summary="One session with its turns"),
    Route("PUT", "/v1/conversations/{cid}/sessions/{sid}", "replace_session", SessionIn,
          ReplacedOut, summary="Replace a session in its place (one write)"),
    Route("DELETE", "/v1/conversations/{cid}/sessions/{sid}", "remove_session", None,
          RemovedOut, summary="Remove one session"),
    Route("POST", "/v1/search", "search", SearchIn, SearchOut,
          summary="Rank sessions for questions"),
    Route("POST", "/v1/compact", "compact", None, CompactedOut,
          summary="Compact now: no file of the folder keeps removed sessions"),
)


def route(name: str) -> Route:
    """The route of handler ``name``."""
    for r in ROUTES:
        if r.name == name:
            return r
    raise KeyError(name)


def _route_parts(path: str) -> list:
    return path.strip("/").split("/")


def openapi(version: str = "", limits: Optional[Limits] = None) -> dict:
    """The OpenAPI 3.1 document of :data:`ROUTES` (what ``/openapi.json`` serves): every
    route with its request and answer schemas (generated from the models above), its
    error answer, its path and query parameters, and the bearer key."""
    from pydantic.json_schema import models_json_schema

    lim = limits or Limits()
    models = {ErrorOut}
    for r in ROUTES:
        for m in (r.body, r.answer):
            if m is None:
                continue
            models.update(getattr(m, "__args__", None) or (m,))
    ordered = sorted(models, key=lambda m: m.__name__)
    _, top = models_json_schema(
        [(m, "validation" if issubclass(m, _Model) else "serialization") for m in ordered],
        ref_template="#/components/schemas/{model}")
    ref = lambda m: {"$ref": f"#/components/schemas/{m.__name__}"}  # noqa: E731
    error = {"description": "an error: its code and a one-line message",
             "content": {"application/json": {"schema": ref(ErrorOut)}}}
    paths: dict = {}
    for r in ROUTES:
        op: dict = {"operationId": r.name, "summary": r.summary,
                    "tags": ["memory" if r.auth else "service"]}
        params = [{"name": p[1:-1], "in": "path", "required": True,
                   "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                   "description": "percent-encoded (%2F for a '/' in an id)"}
                  for p in _route_parts(r.path) if p.startswith("{")]
        if "limit" in r.query:
            params.append({"name": "limit", "in": "query", "required": False,
                           "schema": {"type": "integer", "minimum": 1,
                                      "maximum": lim.max_page,
                                      "default": lim.default_page}})
        if "cursor" in r.query:
            params.append({"name": "cursor", "in": "query", "required": False,
                           "schema": {"type": "string"},
                           "description": "the next_cursor of the previous page"})
        if params:
            op["parameters"] = params
        if r.body is not None:
            kinds = getattr(r.body, "__args__", None)
            schema = {"oneOf": [ref(m) for m in kinds]} if kinds else ref(r.body)
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": schema}}}
        if r.answer is None:
            ok = {"description": "Prometheus text format",
                  "content": {"text/plain": {"schema": {"type": "string"}}}}
        else:
            ok = {"description": r.answer.__doc__.strip().splitlines()[0]
                  if r.answer.__doc__ and r.answer.__doc__.strip() else r.answer.__name__,
                  "content": {"application/json": {"schema": ref(r.answer)}}}
        op["responses"] = {str(r.status): ok, "default": error}
        if r.auth:
            op["security"] = [{"bearer": []}, {}]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "memgas serve", "version": version or "1",
                 "description": "Long-term conversational memory over HTTP: add sessions, "
                                "search them, forget them (docs/serving.md)."},
        "paths": paths,
        "components": {"schemas": top.get("$defs", {}),
                       "securitySchemes": {"bearer": {
                           "type": "http", "scheme": "bearer",
                           "description": "a key of the server's keys file (with keys, "
                                          "every /v1 route needs one)"}}},
    }


def session_body(session, summary=None, keywords=None, metadata=None) -> dict:
    """The JSON of one session (what :meth:`Client.add_session` sends): its messages
    when it keeps their structure, else its turns, so that the server stores exactly
    ``session``'s turns."""
    body: dict = {"id": session.id, "date": session.date}
    if session.first_lengths:
        body["messages"] = list(session.messages)
    else:
        body["turns"] = list(session.turns)
    for k, v in (("summary", summary), ("keywords", keywords), ("metadata", metadata)):
        if v is not None:
            body[k] = v
    return body

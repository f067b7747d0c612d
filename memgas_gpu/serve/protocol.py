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
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr, ValidationError, model_validator)

__all__ = [
    "ApiError", "ERRORS", "CLIENT_EXCEPTIONS", "Limits", "ROUTES", "Route", "route",
    "MAX_BODY_BYTES", "MAX_ID_CHARS", "error_of", "validation_error", "Message",
    "SessionIn", "SessionsIn", "SearchIn", "EvidenceOut", "SearchResultOut", "SearchOut",
    "ConversationOut", "ConversationsPage", "SessionInfo", "SessionsPage", "SessionOut",
    "AddedSession", "AddedOut", "ReplacedOut", "RemovedOut", "ForgottenOut", "CompactedOut",
    "HealthOut", "ReadyOut", "ErrorOut", "session_body", "parse_date",
]

#: request bodies larger than this are refused with 413 (8 MiB)
MAX_BODY_BYTES = 8 << 20
#: conversation and session ids: at most this many characters
MAX_ID_CHARS = 512
#: a search's ``k`` and ``evidence`` at most
MAX_K, MAX_EVIDENCE = 1000, 100


@dataclass(frozen=True)
class Limits:
    """What one request may ask (``memgas serve --max-...``): a request over a limit is
    refused (413 for a body, 422 naming the limit otherwise)."""

    #: bytes of a request body
    max_body_bytes: int = MAX_BODY_BYTES
    #: questions of one search
    max_questions: int = 256
    #: sessions of one add
    max_sessions: int = 256
    #: conversations or sessions of one page of a listing
    max_page: int = 1000


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
        from ..retrieve.params import ReadParams
        from ..retrieve.presets import METHODS

        if isinstance(self.conversation_id, list) and \
                len(self.conversation_id) != len(self.questions):
            raise ValueError(f"conversation_id: {len(self.conversation_id)} ids for "
                             f"{len(self.questions)} questions (one id, or one per question)")
        if self.method is not None and self.method not in METHODS:
            raise ValueError(f"method: {self.method[:40]!r} is not one of "
                             f"{', '.join(METHODS)}")
        if self.settings:
            try:
                ReadParams().replace(**self.settings)
            except ValueError as e:  # SettingsError names the setting
                raise ValueError(f"settings: {e}") from None
        return self

    def kwargs(self) -> dict:
        """The keyword arguments of :meth:`MemoryIndex.search` (settings merged in)."""
        out = {"k": self.k, "method": self.method, "evidence": self.evidence,
               "question_date": self.question_date, "after": self.after,
               "before": self.before, "metadata": self.metadata}
        out.update(self.settings)
        return out


# ---------------------------------------------------------------------------- answers
class EvidenceOut(_Model):
    turn: int
    text: Optional[str]
    score: float


class SearchResultOut(_Model):
    """One question's answer: the sessions (best first), their scores, best turns,
    dates and metadata."""

    conversation_id: str
    session_ids: list[str]
    scores: list[float]
    evidence: list[list[EvidenceOut]]
    dates: list[str]
    metadata: list[dict[str, Scalar]]


class SearchOut(_Model):
    results: list[SearchResultOut]


class ConversationOut(_Model):
    """A conversation: its session count and the range of its session dates."""

    id: str
    sessions: int
    first_date: Optional[str] = None
    last_date: Optional[str] = None


class ConversationsPage(_Model):
    conversations: list[ConversationOut]
    next_cursor: Optional[str] = None


class SessionInfo(_Model):
    id: str
    date: str
    metadata: dict[str, Scalar]


class SessionsPage(_Model):
    conversation_id: str
    sessions: list[SessionInfo]
    next_cursor: Optional[str] = None


class SessionOut(SessionInfo):
    turns: Optional[list[str]]


class AddedSession(_Model):
    id: str
    date: str
    turns: int


class AddedOut(_Model):
    conversation_id: str
    added: list[AddedSession]


class ReplacedOut(_Model):
    conversation_id: str
    replaced: AddedSession


class RemovedOut(_Model):
    conversation_id: str
    removed: str


class ForgottenOut(_Model):
    forgotten: str


class CompactedOut(_Model):
    """A compaction: sessions dropped, and that no file of the folder holds them."""

    dropped: int


class HealthOut(_Model):
    status: Literal["ok"]


class ReadyOut(_Model):
    status: Literal["ready"]
    conversations: int
    sessions: int
    log_bytes: int


class ErrorDetail(_Model):
    code: str
    message: str


class ErrorOut(_Model):
    error: ErrorDetail


# ---------------------------------------------------------------------------- errors
#: error code → (HTTP status, the exception :class:`~memgas_gpu.serve.client.Client`
#: raises: None for :class:`~memgas_gpu.serve.client.ServerError`)
ERRORS: dict = {
    "bad_request": (400, ValueError),     # not JSON, not an object, a bad path
    "unauthorized": (401, None),          # no key, or not a key of this server
    "not_found": (404, KeyError),         # no such route, conversation or session
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


def error_of(e: BaseException) -> ApiError:
    """The answer for an exception of the memory (one table for the server, the Ray
    shards and, reversed, the client): KeyError → not_found, TypeError →
    invalid_type, ValueError → invalid_value; an ApiError as it is."""
    if isinstance(e, ApiError):
        return e
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
    loc = ".".join(replace_surrogates(str(x)) for x in err["loc"]
                   if not (isinstance(x, str) and _TAG.match(x)))
    kind = err["type"]
    msg = replace_surrogates(str(err["msg"])).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return ApiError("invalid_value", f"{loc or what}: unknown field")
    if kind == "missing":
        return ApiError("invalid_value", f"{loc or what}: missing field")
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
          summary="Ready: the memory is open (what it holds)"),
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

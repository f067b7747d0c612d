"""The JSON of ``memgas serve``'s routes: the error format and the checks of request
bodies (one message naming the field).  Shared by the server and :class:`Client`;
needs neither torch nor the web stack.

Errors are ``{"error": {"code": CODE, "message": MESSAGE}}`` with the HTTP status of
:data:`STATUS`; :data:`EXCEPTIONS` is the Python exception the client raises for each
code.
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["ApiError", "STATUS", "EXCEPTIONS", "MAX_BODY_BYTES", "MAX_ID_CHARS",
           "parse_sessions", "parse_search", "check_id", "error_body", "session_body"]

#: request bodies larger than this are refused with 413 (8 MiB)
MAX_BODY_BYTES = 8 << 20
#: conversation and session ids of the API: at most this many characters
MAX_ID_CHARS = 512

#: error code → HTTP status
STATUS = {
    "bad_request": 400,      # not JSON, not an object
    "unauthorized": 401,     # no key, or not a key of this server
    "not_found": 404,        # no such route, conversation or session
    "method_not_allowed": 405,
    "conflict": 409,         # the session id is taken; a conversation that cannot go
    "too_large": 413,        # the body is over the bound
    "invalid_type": 422,     # a field of the wrong type (the client raises TypeError)
    "invalid_value": 422,    # a field with a wrong value (the client raises ValueError)
    "internal": 500,         # a bug: reported without details, logged by the server
    "unavailable": 503,      # shutting down
}

#: error code → the exception :class:`~memgas_gpu.serve.client.Client` raises
#: (others: :class:`~memgas_gpu.serve.client.ServerError`)
EXCEPTIONS = {"not_found": KeyError, "invalid_type": TypeError, "invalid_value": ValueError,
              "conflict": ValueError, "bad_request": ValueError}


class ApiError(Exception):
    """An error answer: ``code`` (a key of :data:`STATUS`) and a one-line message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def status(self) -> int:
        return STATUS[self.code]

    @classmethod
    def of(cls, e: BaseException, where: str = "") -> "ApiError":
        """``invalid_type`` for a TypeError, ``invalid_value`` for a ValueError, with
        ``where`` (the field) before the message."""
        code = "invalid_type" if isinstance(e, TypeError) else "invalid_value"
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        return cls(code, f"{where}: {msg}" if where else msg)


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _type(what: str, want: str, got: Any) -> ApiError:
    return ApiError("invalid_type", f"{what} must be {want}, got {_name(got)}")


def _name(x: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(x),
                                                                      type(x).__name__)


def _fields(body: Any, what: str, allowed: tuple, required: tuple = ()) -> dict:
    if not isinstance(body, dict):
        raise _type(what, "a JSON object", body)
    extra = [k for k in body if k not in allowed]
    if extra:
        raise ApiError("invalid_value", f"{what}: unknown field {extra[0]!r} (fields: "
                                        f"{', '.join(allowed)})")
    missing = [k for k in required if k not in body]
    if missing:
        raise ApiError("invalid_value", f"{what}: missing field {missing[0]!r}")
    return body


def check_id(value: Any, what: str) -> str:
    """A conversation or session id of the API: a non-empty string of at most
    :data:`MAX_ID_CHARS` characters."""
    if not isinstance(value, str):
        raise _type(what, "a string", value)
    if not value:
        raise ApiError("invalid_value", f"{what} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise ApiError("invalid_value", f"{what} is longer than {MAX_ID_CHARS} characters")
    return value


def _opt_str(body: dict, key: str, what: str) -> Optional[str]:
    v = body.get(key)
    if v is not None and not isinstance(v, str):
        raise _type(f"{what}.{key}" if what else key, "a string or null", v)
    return v


SESSION_FIELDS = ("id", "date", "messages", "turns", "metadata", "summary", "keywords")


def parse_session(body: Any, what: str = "body") -> dict:
    """One session of ``POST /v1/conversations/{cid}/sessions``: ``{"session":
    Session, "summary", "keywords", "metadata"}``.

    ``messages`` are ``{"role", "content"}`` objects or ``"[role]: content"`` strings,
    paired into turns as :meth:`Session.from_messages` does; ``turns`` (instead of
    ``messages``) are turn texts stored as given.
    """
    from ..data.model import Session

    b = _fields(body, what, SESSION_FIELDS, ("id",))
    sid = check_id(b["id"], f"{what}.id")
    date = b.get("date", "")
    if date is None:
        date = ""
    if not isinstance(date, str):
        raise _type(f"{what}.date", "a string", date)
    if ("messages" in b) == ("turns" in b):
        raise ApiError("invalid_value", f"{what}: give either 'messages' or 'turns'")
    if "messages" in b:
        msgs = b["messages"]
        if not isinstance(msgs, list):
            raise _type(f"{what}.messages", "an array", msgs)
        try:
            session = Session.from_messages(sid, date, msgs)
        except (TypeError, ValueError) as e:
            raise ApiError.of(e, f"{what}.messages") from None
    else:
        turns = b["turns"]
        if not isinstance(turns, list) or not turns:
            raise _type(f"{what}.turns", "a non-empty array of strings", turns)
        bad = [j for j, t in enumerate(turns) if not isinstance(t, str)]
        if bad:
            raise _type(f"{what}.turns[{bad[0]}]", "a string", turns[bad[0]])
        session = Session(sid, date, tuple(turns))
    md = b.get("metadata")
    if md is not None and not isinstance(md, dict):
        raise _type(f"{what}.metadata", "an object or null", md)
    return {"session": session, "summary": _opt_str(b, "summary", what),
            "keywords": _opt_str(b, "keywords", what), "metadata": md}


def parse_sessions(body: Any) -> list[dict]:
    """The sessions of ``POST /v1/conversations/{cid}/sessions``: one session object,
    or ``{"sessions": [...]}``; every one checked (ids unique) before any is added."""
    if isinstance(body, dict) and "sessions" in body:
        _fields(body, "body", ("sessions",))
        items = body["sessions"]
        if not isinstance(items, list) or not items:
            raise _type("sessions", "a non-empty array of session objects", items)
        out = [parse_session(s, f"sessions[{j}]") for j, s in enumerate(items)]
    else:
        out = [parse_session(body)]
    seen: dict = {}
    for j, s in enumerate(out):
        sid = s["session"].id
        if sid in seen:
            raise ApiError("invalid_value", f"sessions[{j}].id {sid!r} repeats "
                                            f"sessions[{seen[sid]}].id")
        seen[sid] = j
    return out


SEARCH_FIELDS = ("conversation_id", "questions", "k", "method", "evidence", "question_date",
                 "after", "before", "metadata", "settings")


def parse_search(body: Any) -> dict:
    """The arguments of ``POST /v1/search`` (the types checked here; values by the
    memory's own checks): ``conversation_id`` (one id, or one per question),
    ``questions``, and the keyword arguments of :meth:`MemoryIndex.search`."""
    b = _fields(body, "body", SEARCH_FIELDS, ("conversation_id", "questions"))
    cid = b["conversation_id"]
    if isinstance(cid, list):
        cids = [check_id(c, f"conversation_id[{j}]") for j, c in enumerate(cid)]
    else:
        cids = check_id(cid, "conversation_id")
    qs = b["questions"]
    if not isinstance(qs, list):
        raise _type("questions", "an array of strings", qs)
    for j, q in enumerate(qs):
        if not isinstance(q, str):
            raise _type(f"questions[{j}]", "a string", q)
    if not qs:
        raise ApiError("invalid_value", "questions is empty: ask at least one")
    out = {"conversation_id": cids, "queries": qs}
    for key in ("k", "evidence"):
        if key in b:
            v = b[key]
            if isinstance(v, bool) or not isinstance(v, int):
                raise _type(key, "an integer", v)
            out[key] = v
    for key in ("method", "question_date", "after", "before"):
        out[key] = _opt_str(b, key, "")
    md = b.get("metadata")
    if md is not None and not isinstance(md, dict):
        raise _type("metadata", "an object or null", md)
    out["metadata"] = md
    st = b.get("settings") or {}
    if not isinstance(st, dict):
        raise _type("settings", "an object", st)
    out["settings"] = st
    return out


def session_body(session, summary=None, keywords=None, metadata=None) -> dict:
    """The JSON of one session for ``POST /v1/conversations/{cid}/sessions`` (what
    :meth:`Client.add_session` sends): its messages when it keeps their structure,
    else its turns, so that the server stores exactly ``session``'s turns."""
    body: dict = {"id": session.id, "date": session.date}
    if session.first_lengths:
        body["messages"] = list(session.messages)
    else:
        body["turns"] = list(session.turns)
    for k, v in (("summary", summary), ("keywords", keywords), ("metadata", metadata)):
        if v is not None:
            body[k] = v
    return body

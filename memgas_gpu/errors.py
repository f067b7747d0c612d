"""The base of memgas_gpu's errors, and the list of every error class.

Each area keeps its errors next to the code that raises them; every one but
``JSONLimitError`` is a :class:`MemgasError`, which the command line reports as one line
with exit status 2 (docs/failure.md). Where a class is importable from a package, that
is its public home; the module is where it is defined.

==========================  ==============================  ===========================
class                       defined in (public home)        raised for
==========================  ==============================  ===========================
``MemgasError``             ``errors`` (``memgas_gpu``)     base class only
``DataFormatError``         ``errors`` (``memgas_gpu``)     a malformed dataset file
                                                            (file, record, field)
``JSONLimitError``          ``_io``                         a JSON number too long to
                                                            parse (a ValueError only)
``SettingsError``           ``settings``                    a setting of ReadParams,
                            (``memgas_gpu.retrieve``)       BuildParams, GraphParams or
                                                            GamParams: wrong type, out
                                                            of range, unknown name
``NonFiniteScoresError``    ``retrieve.engine``             NaN or inf signals/scores
                            (``memgas_gpu.retrieve``)       in a retrieval
``EncoderMismatchError``    ``memory.index``                a query encoder other than
                            (``memgas_gpu.retrieve``)       the index's
``IndexFormatError``        ``storage.validate``            an index folder this
                            (``memgas_gpu.retrieve``)       version cannot read
``IndexConflictError``      ``storage.folder``              a save into a folder another
                            (``memgas_gpu.retrieve``)       writer saved to meanwhile
``IndexLockError``          ``storage.lock``                a folder's lock held (a save
                            (``memgas_gpu.retrieve``)       past its timeout, a memory
                                                            open to write), or a lock
                                                            file that is not one
``WALError``                ``storage.log``                 a write-ahead log closed or
                                                            failed
``WALCorruptionError``      ``storage.log``                 damage in a log that is not
                                                            a torn last record
``RecordTooLargeError``     ``storage.log``                 a log record over the bound
``RecordError``             ``storage.records``             a log record this version
                                                            does not write
``DeviceError``             ``_checks``                     a device this torch build or
                                                            machine does not have
``EncoderLoadError``        ``encode.encoder``              a model name or folder that
                            (``memgas_gpu.encode``)         does not open as an encoder
``EncoderRecordError``      ``encode.record``               an index's malformed or
                            (``memgas_gpu.encode``)         unopenable encoder record
``StoreError``              ``encode.store``                an embedding store that does
                            (``memgas_gpu.encode``)         not match the request
``LLMError``                ``llm.config``                  base of the LLM stages'
                            (``memgas_gpu.llm``)            errors
``LLMConfigError``          ``llm.config``                  a missing or invalid
                            (``memgas_gpu.llm``)            endpoint setting
``LLMRequestError``         ``llm.client``                  a request failed for good
                            (``memgas_gpu.llm``)            (4xx, bad body, retries)
``CacheError``              ``llm.cache``                   a response cache that cannot
                                                            be opened or is not one
``SynthParamError``         ``synth._writer``               an invalid synthetic-data
                            (``memgas_gpu.synth``)          generator parameter
``KeyFileError``            ``serve.tenants``               an API keys file (or
                            (``memgas_gpu.serve``)          MEMGAS_API_KEYS) that is not
                                                            a key → tenant map
``ClientError``             ``serve.client``                base of mg.Client's own
                            (``memgas_gpu.serve``)          errors (each names the URL)
``ClientConnectionError``   ``serve.client``                no answer from the server
                                                            (refused, reset, DNS; its
                                                            subclass ClientTimeout: no
                                                            answer in time)
``ProtocolError``           ``serve.client``                an answer that is not memgas
                                                            serve's (another server, a
                                                            proxy's page, a redirect)
``ServerError``             ``serve.client``                an answer of memgas serve
                            (``memgas_gpu.serve``)          that is no result (no key, a
                                                            body too large, a failure)
``ShardLayoutError``        ``serve.ray_serve``             a folder whose shards do not
                                                            match ``--replicas``
``ApiError``                ``serve.protocol``              an error answer of memgas
                                                            serve (sent as JSON; not a
                                                            MemgasError, never raised
                                                            to a caller)
==========================  ==============================  ===========================
"""
from __future__ import annotations

from typing import Optional, Union

__all__ = ["DataFormatError", "MemgasError"]


class MemgasError(Exception):
    """Base class of memgas_gpu errors that the CLI reports without a traceback."""


class DataFormatError(MemgasError, ValueError):
    """A malformed input file.

    The message names the file, the record (index and/or id) and the field, e.g.
    ``data.json: record 3 (id 'q7'): field 'haystack_sessions': expected a list, got str``.
    """

    def __init__(
        self,
        path: str,
        message: str,
        *,
        record: Optional[Union[int, str]] = None,
        record_id: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        self.path = str(path)
        self.record = record
        self.record_id = record_id
        self.field = field
        parts = [self.path]
        if record is not None or record_id is not None:
            r = "record"
            if record is not None:
                r += f" {record}"
            if record_id is not None:
                r += f" (id {record_id!r})"
            parts.append(r)
        if field is not None:
            parts.append(f"field {field!r}")
        parts.append(message)
        super().__init__(": ".join(parts))

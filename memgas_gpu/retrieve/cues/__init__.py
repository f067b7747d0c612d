"""Question cues from the data, each a signal of the registry
(:mod:`memgas_gpu.retrieve.signals`) in a module of its own:

* :mod:`.speaker`: ``bm25_Tmax`` with the speaker a question names counting more;
* :mod:`.time`: the ``time`` cue, a question's date expression against session dates;
* :mod:`.dates`: reading dates (once, when a session is written).
"""
from .dates import days_since_epoch, parse_date, question_interval, session_days
from .speaker import (SpeakerBM25, SpeakerData, best_turn_scores, message_data,
                      named_speakers, speaker_bm25, speaker_data_of, speaker_turn_bm25,
                      speaker_turn_signal, split_messages)
from .time import time_affinity_of, time_cue

__all__ = ["SpeakerData", "message_data", "best_turn_scores", "days_since_epoch",
           "SpeakerBM25", "speaker_bm25", "named_speakers", "split_messages", "parse_date",
           "question_interval", "session_days", "time_affinity_of", "time_cue",
           "speaker_data_of", "speaker_turn_signal", "speaker_turn_bm25"]

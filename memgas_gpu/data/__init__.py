"""Data model and loaders (LongMemEval, LoCoMo, Long-MT-Bench+)."""
from .loader import FORMATS, detect_format, load_dataset
from .locomo import LOCOMO_CATEGORIES
from .model import Conversation, Dataset, Question, Session, pair_messages

__all__ = ["Conversation", "Dataset", "Question", "Session", "pair_messages",
           "load_dataset", "detect_format", "FORMATS", "LOCOMO_CATEGORIES"]

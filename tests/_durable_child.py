"""A writer of a durable memory, killed at random moments by tests/test_durable.py.

Usage: python _durable_child.py FOLDER BERT_FOLDER SEED CHECKPOINT_BYTES

It opens the memory on FOLDER and writes forever: adds (mostly), removes, forgets,
checkpoints and compactions chosen by SEED.  Before each operation it prints the line
``intent <json>``, and once the call returned, ``ack <n>`` (flushed): what was
acknowledged is exactly what printed an ack.  ``ready`` is printed once the memory is
open (recovery done).
"""
import json
import random
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from memgas_gpu import Session  # noqa: E402
from memgas_gpu.encode import Encoder  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402

from _memory_model import DATES, KEYWORDS, POOL, SUMMARIES  # noqa: E402

CONVS = ["A", "B", "C", "D"]


def main() -> None:
    folder, bert, seed, ckpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    enc = Encoder(bert, device="cpu", max_length=64)
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=ckpt)
    print("ready", flush=True)
    rng = random.Random(seed)
    n = 0
    while True:
        r = rng.random()
        held = {c.id: list(c.session_ids) for c in mem.conversations}
        if r < 0.6 or not held:
            cid = rng.choice(CONVS)
            p = rng.randrange(len(POOL))
            if POOL[p].id in held.get(cid, ()):
                continue
            op = {"op": "add", "conv": cid, "p": p, "d": rng.randrange(len(DATES)),
                  "u": rng.randrange(len(SUMMARIES)), "k": rng.randrange(len(KEYWORDS)),
                  "meta": {"n": n}}
        elif r < 0.8:
            cid = rng.choice(sorted(held))
            if not held[cid]:
                continue
            op = {"op": "remove", "conv": cid, "sid": rng.choice(held[cid])}
        elif r < 0.85:
            op = {"op": "forget", "conv": rng.choice(sorted(held))}
        elif r < 0.95:
            op = {"op": "checkpoint"}
        else:
            op = {"op": "compact"}
        print("intent " + json.dumps(op), flush=True)
        apply(mem, op, enc)
        n += 1
        print(f"ack {n}", flush=True)


def apply(mem, op: dict, enc) -> None:
    """One operation on a memory (the parent applies the acknowledged ones to its own
    in-RAM oracle with this same function)."""
    if op["op"] == "add":
        s = POOL[op["p"]]
        mem.add_session(op["conv"], Session(s.id, DATES[op["d"]], s.turns),
                        summary=SUMMARIES[op["u"]], keywords=KEYWORDS[op["k"]],
                        encoder=enc, metadata=op.get("meta"))
    elif op["op"] == "remove":
        mem.remove_session(op["conv"], op["sid"])
    elif op["op"] == "forget":
        mem.forget_conversation(op["conv"])
    elif op["op"] == "checkpoint":
        if mem.folder is not None:
            mem.checkpoint()
    elif op["op"] == "compact":
        mem.compact()


if __name__ == "__main__":
    main()

"""The one read path: presets, settings validation, and ``memgas`` against the
implementation it replaced (``tests/_legacy_memgas.py``, frozen), on real LoCoMo.

The engine was bit-identical to it (``torch.equal``, commit ebb9996); since the dense
signals come from one sampled product over the distinct-session table instead of one
matrix product per conversation (issue 14), the last float32 bits of a dot product may
differ: scores agree to 1e-6 and every ranking is the same."""
from __future__ import annotations

import pytest
import torch

from memgas_gpu.ops import rank_sessions
from memgas_gpu.granularity import CODES, N_GRAN, expand_ranges, granularity, node_ids
from memgas_gpu.retrieve import METHODS, PRESETS, MemoryIndex, SettingsError, retrieve
from memgas_gpu.retrieve.engine import resolve

from _legacy_memgas import legacy_retrieve_scores


def _two_conversations(idx: MemoryIndex) -> MemoryIndex:
    """conv-30 plus a second conversation made of its first 13 sessions (different
    sizes, so padding and the packed PageRank rows are exercised)."""
    n1, n2 = idx.n_rows, 13
    c = idx.conversations[0]
    from memgas_gpu.memory.meta import ConversationMeta

    metas = [c, ConversationMeta("copy", c.session_ids[:n2], c.session_dates[:n2])]
    return MemoryIndex(conversations=metas, questions=idx.questions + idx.questions,
                       conv_offsets=torch.tensor([0, n1, n1 + n2]),
                       row_slot=torch.cat([idx.snapshot().row_slot, idx.snapshot().row_slot[:n2]]), gran=idx.snapshot().gran,
                       concat=idx.snapshot().concat, q_emb=torch.cat([idx.q_emb, idx.q_emb]),
                       q_conv=torch.cat([torch.zeros(len(idx.questions), dtype=torch.long),
                                         torch.ones(len(idx.questions), dtype=torch.long)]),
                       graphs={}, params=idx.params, config=idx.config)


@pytest.mark.parametrize("method", ["memgas", "no_gmm", "no_ppr", "no_router",
                                    "no_association"])
def test_memgas_presets_match_the_replaced_path(locomo_index, method):
    _, idx = locomo_index
    two = _two_conversations(idx)
    want = legacy_retrieve_scores(two, method)
    got = retrieve(two, method=method, device="cpu")  # 105 questions per conversation
    assert got.scores.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got.scores, want, rtol=0, atol=1e-6)
    assert torch.equal(got.rankings, rank_sessions(want, got.n_sessions))
    # one question per conversation (the LongMemEval shape: the sampled product)
    for q in range(0, 105, 7):
        one = retrieve(two, questions=[q, 105 + q], method=method, device="cpu")
        w = want[[q, 105 + q], :one.scores.shape[1]]
        torch.testing.assert_close(one.scores, w, rtol=0, atol=1e-6)
        assert torch.equal(one.rankings, rank_sessions(w, one.n_sessions))


def test_one_minus_router_and_settings_match(locomo_index):
    _, idx = locomo_index
    want = legacy_retrieve_scores(idx, "memgas", temperature=0.5, alpha=7, damping=0.3,
                                  router="one_minus")
    got = retrieve(idx, method="memgas", device="cpu", temperature=0.5, alpha=7, damping=0.3,
                   router="one_minus")
    torch.testing.assert_close(got.scores, want, rtol=0, atol=1e-6)
    assert torch.equal(got.rankings, rank_sessions(want, got.n_sessions))


def test_every_method_is_a_preset():
    assert set(METHODS) == set(PRESETS)
    assert PRESETS["no_ppr"].fusion == "seeds" and PRESETS["memgas"].fusion == "ppr"
    assert PRESETS["no_router"].router == "uniform" and PRESETS["no_gmm"].graph == "topk"
    assert PRESETS["no_association"].graph == "none"
    assert PRESETS["memgas_hybrid"].signals == "auto"


@pytest.mark.parametrize("bad, match", [
    ({"temperature": float("nan")}, "temperature must be finite"),
    ({"temperature": 0}, "temperature must be >"),
    ({"temperature": -1.0}, "temperature must be >"),
    ({"damping": 1.5}, "damping must be <= 1"),
    ({"damping": float("inf")}, "damping must be finite"),
    ({"alpha": 0}, "alpha must be an integer from 1 to"),
    ({"alpha": 2.5}, "alpha must be an integer"),
    ({"b": -0.1}, "b must be >= 0"),
    ({"norm": "l2"}, "norm must be one of"),
    ({"signals": "dense_X"}, "unknown signal"),
    ({"bogus": 1}, "unknown setting"),
])
def test_settings_are_validated(bad, match):
    with pytest.raises(SettingsError, match=match):
        resolve(None, "memgas", **bad)


def test_negative_question_index_is_refused(locomo_index):
    _, idx = locomo_index
    with pytest.raises(IndexError, match="out of range"):
        retrieve(idx, questions=[-1], device="cpu")
    with pytest.raises(IndexError, match="out of range"):
        retrieve(idx, questions=[len(idx.questions)], device="cpu")


def test_eval_temperature_reaches_memgas_hybrid(locomo_index):
    """The old CLI mapping dropped --temperature for memgas_hybrid."""
    _, idx = locomo_index
    a = retrieve(idx, method="memgas_hybrid", device="cpu", temperature=0.05)
    b = retrieve(idx, method="memgas_hybrid", device="cpu")
    assert a.params["temperature"] == 0.05 and b.params["temperature"] == 1.0
    assert not torch.equal(a.scores, b.scores)


def test_granularity_home():
    assert CODES == "STUK" and N_GRAN == 4
    assert granularity("summary").code == "U" and granularity("K").index == 3
    with pytest.raises(KeyError, match="unknown granularity"):
        granularity("paragraph")
    assert node_ids(torch.tensor([0, 2])).tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert node_ids(torch.tensor([1, 3]), "turn").tolist() == [5, 13]
    owner, ids = expand_ranges(torch.tensor([0, 2, 2, 5]), torch.tensor([2, 0]))
    assert owner.tolist() == [0, 0, 0, 1, 1] and ids.tolist() == [2, 3, 4, 0, 1]


def test_time_cue_by_hand(locomo_index):
    """A question naming the date of session 3 ("on 1 February, 2023" for LoCoMo's
    conv-30) adds time_beta to exactly the sessions of that day (dates read by strptime,
    independently of the cue's parser); a question without a date gets nothing."""
    from datetime import datetime

    from memgas_gpu.retrieve import QueryBatch
    from memgas_gpu.retrieve.engine import score

    _, idx = locomo_index
    view = idx.snapshot()
    dates = idx.conversations[0].session_dates
    day = dates[2].split(" on ", 1)[1]  # "1 February, 2023"
    texts = [f"What did Gina find for her clothing store on {day}?",
             "What kind of dog does Jon have?"]
    batch = QueryBatch(idx.q_emb[:2], torch.zeros(2, dtype=torch.long),
                       view.lexical.encode_queries(texts), texts, [None, None])
    on, _ = score(view, batch, resolve(view, "memgas_hybrid", time_beta=2.0)[0], "cpu")
    off, _ = score(view, batch, resolve(view, "memgas_hybrid", time_beta=0.0)[0], "cpu")
    want_day = datetime.strptime(day, "%d %B, %Y").date()
    want = torch.tensor([2.0 if datetime.strptime(d.split(" on ", 1)[1], "%d %B, %Y").date()
                         == want_day else 0.0 for d in dates], dtype=on.dtype)
    assert want.sum() >= 2.0
    torch.testing.assert_close(on[0] - off[0], want, rtol=0, atol=1e-9)
    assert (on[1] - off[1]).abs().max() < 1e-9

"""ExLM math: expansion, transitions, the DAG loss against brute force, gradients, 2D rotary."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from maskstream.trainer.exlm import (
    ExLMForMaskedLM,
    TransitionHead,
    dag_best_path,
    dag_log_likelihood,
    evaluation_counts,
    expand_batch,
    expand_masked_batch,
    predict_masked_tokens,
    rotary_2d,
)

CLS, SEP, MASK, PAD = 101, 102, 103, 0


def test_expand_batch_hand_example():
    input_ids = torch.tensor([[CLS, 11, 12, 13, 14, SEP, PAD], [CLS, 21, 22, SEP, PAD, PAD, PAD]])
    attention = (input_ids != PAD).long()
    chosen = torch.zeros_like(input_ids, dtype=torch.bool)
    chosen[0, 2] = chosen[0, 4] = chosen[1, 1] = True
    x = expand_batch(input_ids, attention, chosen, num_states=2, mask_token_id=MASK)

    assert x.input_ids.tolist() == [
        [CLS, CLS, 11, MASK, MASK, 13, MASK, MASK, SEP, SEP],
        [CLS, CLS, MASK, MASK, 22, SEP, SEP, PAD, PAD, PAD],
    ]
    assert x.attention_mask.tolist() == [[1] * 10, [1] * 7 + [0] * 3]
    assert x.positions.tolist() == [[0, 0, 1, 2, 2, 3, 4, 4, 5, 5], [0, 0, 1, 1, 2, 3, 3, 0, 0, 0]]
    assert x.copy_index.tolist() == [[1, 2, 0, 1, 2, 0, 1, 2, 1, 2], [1, 2, 1, 2, 0, 1, 2, 0, 0, 0]]
    assert x.num_vertices.tolist() == [8, 6]
    assert x.vertex_index[0].tolist() == [0, 1, 3, 4, 6, 7, 8, 9]
    assert x.vertex_index[1, :6].tolist() == [0, 1, 2, 3, 5, 6]
    assert x.vertex_mask.tolist() == [[True] * 8, [True] * 6 + [False] * 2]
    assert x.targets.tolist() == [[CLS, 12, 14, SEP], [CLS, 21, SEP, PAD]]
    assert x.target_lengths.tolist() == [4, 3]
    assert x.target_positions.tolist() == [[0, 2, 4, 5], [0, 1, 3, -1]]
    assert x.masked_target_mask.tolist() == [[False, True, True, False], [False, True, False, False]]


def _expand_one(ids: list[int], chosen: list[bool], k: int) -> tuple[list[int], list[int], list[int]]:
    """Straightforward per-sequence expansion, to check the vectorized one against."""
    out_ids, out_pos, out_copy = [], [], []
    for i, (token, c) in enumerate(zip(ids, chosen, strict=True)):
        if c or i in (0, len(ids) - 1):
            out_ids += [MASK if c else token] * k
            out_pos += [i] * k
            out_copy += list(range(1, k + 1))
        else:
            out_ids.append(token)
            out_pos.append(i)
            out_copy.append(0)
    return out_ids, out_pos, out_copy


@pytest.mark.parametrize("k", [1, 3, 4])
def test_expand_batch_matches_per_sequence_expansion(k):
    gen = torch.Generator().manual_seed(k)
    lengths = [12, 5, 9, 2, 12]
    batch = torch.zeros(len(lengths), 12, dtype=torch.long)
    chosen = torch.zeros_like(batch, dtype=torch.bool)
    for b, n in enumerate(lengths):
        batch[b, :n] = torch.randint(1000, 2000, (n,), generator=gen)
        chosen[b, 1 : n - 1] = torch.rand(n - 2, generator=gen) < 0.4
    x = expand_batch(batch, (batch != 0).long(), chosen, num_states=k, mask_token_id=MASK)
    for b, n in enumerate(lengths):
        ids, pos, copy = _expand_one(batch[b, :n].tolist(), chosen[b, :n].tolist(), k)
        m = len(ids)
        assert x.input_ids[b, :m].tolist() == ids
        assert x.positions[b, :m].tolist() == pos
        assert x.copy_index[b, :m].tolist() == copy
        assert x.attention_mask[b].sum() == m
        vertices = [i for i, c in enumerate(copy) if c > 0]
        assert x.vertex_index[b, : len(vertices)].tolist() == vertices
        assert int(x.num_vertices[b]) == len(vertices)
        kept = [0, *[i for i in range(1, n - 1) if chosen[b, i]], n - 1]
        assert x.targets[b, : len(kept)].tolist() == batch[b, kept].tolist()


def test_expand_rejects_bad_input():
    ids = torch.tensor([[CLS, 5, 6, SEP]])
    attention = torch.ones_like(ids)
    with pytest.raises(ValueError, match="between the start and end"):
        expand_batch(ids, attention, torch.tensor([[True, False, False, False]]), num_states=2, mask_token_id=MASK)
    with pytest.raises(ValueError, match="right-padded"):
        expand_batch(ids, torch.tensor([[0, 1, 1, 1]]), torch.zeros_like(ids, dtype=torch.bool), num_states=2, mask_token_id=MASK)
    with pytest.raises(ValueError, match="num_states"):
        expand_batch(ids, attention, torch.zeros_like(ids, dtype=torch.bool), num_states=0, mask_token_id=MASK)


def test_expand_masked_batch_recovers_originals_from_labels():
    original = torch.tensor([[CLS, 5, 6, 7, SEP]])
    masked = torch.tensor([[CLS, MASK, 6, 999, SEP]])  # 80/10/10 left a random token at position 3
    labels = torch.tensor([[-100, 5, -100, 7, -100]])
    x = expand_masked_batch(
        {"input_ids": masked, "attention_mask": torch.ones_like(masked), "labels": labels},
        num_states=2,
        mask_token_id=MASK,
    )
    direct = expand_batch(original, torch.ones_like(original), labels != -100, num_states=2, mask_token_id=MASK)
    assert torch.equal(x.input_ids, direct.input_ids)
    assert x.targets.tolist() == [[CLS, 5, 7, SEP]]


# ---------------------------------------------------------------------------- the DAG


def _random_dag(vertex_counts, target_counts, *, dtype=torch.float64, seed=0):
    """Random normalized emissions [B, T, V] and forward-only log transitions [B, V, V]."""
    gen = torch.Generator().manual_seed(seed)
    batch, v, t = len(vertex_counts), max(vertex_counts), max(target_counts)
    emissions = torch.randn(batch, t, v, generator=gen, dtype=dtype).log_softmax(-1)
    scores = torch.randn(batch, v, v, generator=gen, dtype=dtype)
    order = torch.arange(v)
    nv = torch.tensor(vertex_counts)
    allowed = (order[:, None] < order[None, :]) & (order[None, None, :] < nv[:, None, None])
    allowed &= (order[None, :, None] < nv[:, None, None])
    links = scores.masked_fill(~allowed, -math.inf).log_softmax(-1).masked_fill(~allowed, -math.inf)
    return emissions, links, nv, torch.tensor(target_counts)


def _brute_force(emissions, links, nv, nt, reduce=torch.logsumexp):
    """Enumerates every increasing path 0 = v_0 < ... < v_{T-1} = V-1 of each sequence."""
    results, best_paths = [], []
    for b in range(emissions.shape[0]):
        v, t = int(nv[b]), int(nt[b])
        scores, paths = [], []
        for middle in itertools.combinations(range(1, v - 1), t - 2):
            path = (0, *middle, v - 1)
            score = sum(emissions[b, i, p] for i, p in enumerate(path))
            score = score + sum(links[b, p, q] for p, q in itertools.pairwise(path))
            scores.append(score)
            paths.append(path)
        stacked = torch.stack(scores)
        results.append(reduce(stacked, 0))
        best_paths.append(paths[int(stacked.argmax())])
    return torch.stack(results), best_paths


@pytest.mark.parametrize(
    "vertex_counts,target_counts",
    [([2], [2]), ([4], [4]), ([6], [3]), ([8, 5, 9], [4, 2, 5]), ([12, 7], [6, 7]), ([10, 10], [2, 10])],
)
def test_dag_loss_equals_brute_force_enumeration(vertex_counts, target_counts):
    emissions, links, nv, nt = _random_dag(vertex_counts, target_counts, seed=sum(vertex_counts))
    expected, _ = _brute_force(emissions, links, nv, nt)
    got = dag_log_likelihood(emissions, links, nv, nt)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_dag_loss_brute_force_with_unnormalized_scores():
    # The recursion is a sum over paths of products whatever the numbers are.
    gen = torch.Generator().manual_seed(7)
    emissions = torch.randn(2, 5, 9, generator=gen, dtype=torch.float64)
    links = torch.randn(2, 9, 9, generator=gen, dtype=torch.float64).triu(1)
    links = links.masked_fill(torch.ones(9, 9, dtype=torch.bool).tril(), -math.inf)
    nv, nt = torch.tensor([9, 7]), torch.tensor([5, 3])
    links[1, :, 7:] = -math.inf
    expected, _ = _brute_force(emissions, links, nv, nt)
    torch.testing.assert_close(dag_log_likelihood(emissions, links, nv, nt), expected, rtol=1e-10, atol=1e-10)


def test_viterbi_finds_the_brute_force_best_path():
    emissions, links, nv, nt = _random_dag([9, 6, 10], [4, 3, 6], seed=3)
    best, paths = _brute_force(emissions, links, nv, nt, reduce=lambda x, d: x.max(d).values)
    path, score = dag_best_path(emissions, links, nv, nt)
    torch.testing.assert_close(score, best)
    for b, expected in enumerate(paths):
        assert path[b, : len(expected)].tolist() == list(expected)
        assert (path[b, len(expected) :] == -1).all()


def test_dag_loss_gradcheck_float64():
    gen = torch.Generator().manual_seed(11)
    vertex_counts, nt = torch.tensor([7, 5]), torch.tensor([4, 3])
    order = torch.arange(7)
    allowed = (order[:, None] < order[None, :]) & (order[None, None, :] < vertex_counts[:, None, None])
    allowed &= order[None, :, None] < vertex_counts[:, None, None]

    def loss(logits, scores):
        emissions = logits.log_softmax(-1)
        # masked log-softmax as in TransitionHead; rows without successors are all -inf
        links = scores.masked_fill(~allowed, -math.inf).log_softmax(-1).masked_fill(~allowed, -math.inf)
        links = torch.nan_to_num(links, nan=-math.inf)
        return dag_log_likelihood(emissions, links, vertex_counts, nt)

    logits = torch.randn(2, 4, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    scores = torch.randn(2, 7, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(loss, (logits, scores))
    loss(logits, scores).sum().backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(scores.grad).all()


def test_transition_head_links_only_forward_and_gradcheck():
    torch.manual_seed(0)
    head = TransitionHead(hidden_size=8, num_heads=2, max_positions=32).double()
    hidden = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[0, 1, 3, 4, 9, 10], [0, 1, 2, 3, 0, 0]])
    vertex_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    links = head(hidden, positions, vertex_mask)
    probs = links.exp()
    assert probs.shape == (2, 6, 6)
    assert (probs.tril() == 0).all(), "links must go strictly forward"
    assert (probs[1, :, 4:] == 0).all() and (probs[1, 4:] == 0).all(), "no links to or from padding"
    assert (probs[0, :5] > 0).triu(1)[:, :].sum() == 15  # every forward link inside the graph is possible
    torch.testing.assert_close(probs[0, :5].sum(-1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(probs[1, :3].sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.isneginf(links[0, 5]).all() and torch.isneginf(links[1, 3]).all()  # last vertex: no successor

    def log_likelihood(h):
        emissions = torch.zeros(2, 3, 6, dtype=torch.float64)
        return dag_log_likelihood(emissions, head(h, positions, vertex_mask), torch.tensor([6, 4]), torch.tensor([3, 3]))

    assert torch.autograd.gradcheck(log_likelihood, (hidden,))


# ---------------------------------------------------------------------------- 2D rotary


def _rope_complex(x, position, base=10000.0):
    """RoPE in the rotate-half layout as a complex rotation of (x[i], x[i + d/2]) by position * theta_i."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones(half, dtype=torch.float64), position * theta)
    return torch.cat((z.real, z.imag), dim=-1)


def test_rotary_2d_rotates_halves_by_position_and_copy_index():
    x = torch.randn(16, dtype=torch.float64)
    got = rotary_2d(x.view(1, 16), torch.tensor([5]), torch.tensor([3]))[0]
    torch.testing.assert_close(got[:8], _rope_complex(x[:8], 5.0))
    torch.testing.assert_close(got[8:], _rope_complex(x[8:], 3.0))
    torch.testing.assert_close(rotary_2d(x.view(1, 16), torch.tensor([0]), torch.tensor([0]))[0], x)
    torch.testing.assert_close(got.norm(), x.norm())


def test_rotary_2d_scores_depend_only_on_relative_positions():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 32, generator=gen, dtype=torch.float64)

    def score(pq, cq, pk, ck):
        rq = rotary_2d(q.view(1, 32), torch.tensor([pq]), torch.tensor([cq]))
        rk = rotary_2d(k.view(1, 32), torch.tensor([pk]), torch.tensor([ck]))
        return float((rq * rk).sum())

    reference = score(7, 2, 3, 4)
    for shift_position, shift_copy in [(1, 0), (0, 1), (11, 3), (100, 0)]:
        assert score(7 + shift_position, 2 + shift_copy, 3 + shift_position, 4 + shift_copy) == pytest.approx(reference)
    assert score(8, 2, 3, 4) != pytest.approx(reference)
    assert score(7, 3, 3, 4) != pytest.approx(reference)
    # batched layout [B, heads, L, d] with positions [B, 1, L]
    xs = torch.randn(2, 3, 5, 8, generator=gen)
    pos = torch.arange(5).expand(2, 1, 5)
    out = rotary_2d(xs, pos, torch.zeros_like(pos))
    torch.testing.assert_close(out[..., 4:], xs[..., 4:])


# ---------------------------------------------------------------------------- the model


def _tiny_mlm(seed=0):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)


def _tiny_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (3, 12), generator=gen)
    lengths = torch.tensor([12, 8, 10])
    attention = (torch.arange(12) < lengths[:, None]).long()
    ids[:, 0] = 1
    ids[torch.arange(3), lengths - 1] = 2
    ids = ids * attention
    chosen = (torch.rand(3, 12, generator=gen) < 0.3) & (torch.arange(12) > 0) & (torch.arange(12) < lengths[:, None] - 1)
    return ids, attention, chosen


def _tiny_roberta(seed=0):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=42, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
    )
    return RobertaForMaskedLM(config)


@pytest.mark.parametrize("make_mlm", [_tiny_mlm, _tiny_roberta], ids=["bert", "roberta"])
def test_copy_index_zero_leaves_the_encoder_unchanged(make_mlm):
    mlm = make_mlm().eval()
    model = ExLMForMaskedLM(mlm, num_states=3)
    ids, attention, _ = _tiny_batch()
    plain = mlm.base_model(input_ids=ids, attention_mask=attention).last_hidden_state
    positions = torch.arange(12).expand(3, -1)
    ours = model.encode(ids, attention, positions, torch.zeros_like(ids))
    mask = attention.bool()
    torch.testing.assert_close(ours[mask], plain[mask])
    assert model.copy_embedding.weight[0].abs().sum() == 0 and model.copy_embedding.weight[1:].abs().sum() > 0
    # an expanded copy of the same token at the same original position is embedded differently
    copies = model.encode(ids, attention, positions, torch.ones_like(ids))
    assert not torch.allclose(copies[mask], plain[mask])


def test_roberta_style_model_trains_with_the_exlm_loss():
    model = ExLMForMaskedLM(_tiny_roberta(), num_states=2, mask_token_id=3)
    ids, attention, chosen = _tiny_batch()
    out = model(*_masked(ids, attention, chosen))
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and model.transitions.gate.weight.grad.abs().sum() > 0


def test_model_loss_is_the_dag_loss_and_predictions_are_read_off_the_graph():
    model = ExLMForMaskedLM(_tiny_mlm(), num_states=3)
    ids, attention, chosen = _tiny_batch()
    x = expand_batch(ids, attention, chosen, num_states=3, mask_token_id=3)
    out = model.forward_expanded(x)
    emissions = out.vertex_log_probs.gather(2, x.targets.unsqueeze(1).expand(-1, x.vertex_index.shape[1], -1)).transpose(1, 2)
    expected, _ = _brute_force(emissions.double(), out.log_transitions.double(), x.num_vertices, x.target_lengths)
    torch.testing.assert_close(out.log_likelihood.double(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.loss, -(out.log_likelihood / x.target_lengths).mean())
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert all(torch.isfinite(g).all() for g in grads)
    assert model.transitions.query.weight.grad.abs().sum() > 0 and model.copy_embedding.weight.grad[1:].abs().sum() > 0
    assert model.copy_embedding.weight.grad[0].abs().sum() == 0

    predictions = predict_masked_tokens(out, x)
    assert predictions.shape == x.targets.shape
    assert ((predictions >= 0) == x.target_mask).all()
    counts = evaluation_counts(out, x)
    assert int(counts["masked"]) == int(chosen.sum())
    assert 0 <= int(counts["correct"]) <= int(counts["masked"])
    # every path starts at vertex 0 and ends at the last vertex: their marker emissions are common factors
    rows = torch.arange(3)
    markers = emissions[:, 0, 0] + emissions[rows, x.target_lengths - 1, x.num_vertices - 1]
    assert float(counts["nll"]) == pytest.approx(float(-(out.log_likelihood - markers).detach().sum()), rel=1e-6)
    for b in range(3):  # ... so the brute-force sum over paths without them gives the same number
        e = emissions.detach().double().clone()
        e[b, 0, 0] = 0.0
        e[b, x.target_lengths[b] - 1, x.num_vertices[b] - 1] = 0.0
        without, _ = _brute_force(e[b : b + 1], out.log_transitions.detach().double()[b : b + 1], x.num_vertices[b : b + 1], x.target_lengths[b : b + 1])
        torch.testing.assert_close(float(without), float((out.log_likelihood[b] - markers[b]).detach()), rtol=1e-5, atol=1e-4)


def test_predictions_follow_a_graph_built_to_spell_the_targets():
    # Emissions: vertex v is sure of token 10 + v. Links: the only likely path visits 0, 2, 5, 7.
    vocab, v = 30, 8
    vertex_log_probs = torch.full((1, v, vocab), -20.0)
    vertex_log_probs[0, torch.arange(v), 10 + torch.arange(v)] = 0.0
    links = torch.full((1, v, v), -math.inf)
    for a in range(v):
        for b in range(a + 1, v):
            links[0, a, b] = -10.0
    links[0, 0, 2] = links[0, 2, 5] = links[0, 5, 7] = 0.0
    ids = torch.tensor([[1, 50, 51, 2]])
    x = expand_batch(ids, torch.ones_like(ids), torch.tensor([[False, True, True, False]]), num_states=2, mask_token_id=3)
    assert int(x.num_vertices[0]) == v
    from maskstream.trainer.exlm import ExLMOutput

    out = ExLMOutput(torch.tensor(0.0), torch.zeros(1), vertex_log_probs, links, torch.zeros(1))
    assert predict_masked_tokens(out, x).tolist() == [[10, 12, 15, 17]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_same_code_path_on_cuda():
    ids, attention, chosen = _tiny_batch()
    results = []
    for device in ("cpu", "cuda"):
        model = ExLMForMaskedLM(_tiny_mlm(seed=1), num_states=4).to(device)
        x = expand_batch(ids.to(device), attention.to(device), chosen.to(device), num_states=4, mask_token_id=3)
        out = model.forward_expanded(x)
        out.loss.backward()
        results.append((out.loss.detach().cpu(), model.transitions.key.weight.grad.cpu(), predict_masked_tokens(out, x).cpu()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-3, atol=1e-4)
    assert torch.equal(results[0][2], results[1][2])


def test_loss_of_a_one_path_graph():
    # k = 1: one vertex per target, so the length constraint admits one path, 0 -> 1 -> ... -> T-1;
    # the loss is its emission NLL plus its links' NLL (a vertex may still link further ahead).
    model = ExLMForMaskedLM(_tiny_mlm(), num_states=1)
    ids, attention, chosen = _tiny_batch()
    x = expand_batch(ids, attention, chosen, num_states=1, mask_token_id=3)
    out = model.forward_expanded(x)
    emitted = out.vertex_log_probs.gather(2, x.targets.unsqueeze(-1)).squeeze(-1)
    steps = out.log_transitions.diagonal(offset=1, dim1=1, dim2=2)  # [B, T-1]: t -> t+1
    linked = torch.where(x.target_mask[:, 1:], steps, 0.0)
    expected = -(((emitted * x.target_mask).sum(1) + linked.sum(1)) / x.target_lengths).mean()
    torch.testing.assert_close(out.loss, expected)


def _masked(ids, attention, chosen, mask_token_id=3):
    labels = torch.where(chosen, ids, -100)
    return torch.where(chosen, mask_token_id, ids), attention, labels


def test_forward_on_a_masked_batch_is_the_objective_on_its_expansion():
    model = ExLMForMaskedLM(_tiny_mlm(), num_states=2, mask_token_id=3)
    ids, attention, chosen = _tiny_batch()
    out = model(*_masked(ids, attention, chosen))
    x = expand_batch(ids, attention, chosen, num_states=2, mask_token_id=3)
    direct = model.forward_expanded(x)
    torch.testing.assert_close(out["loss"], direct.loss)
    counts = evaluation_counts(direct, x)
    assert {k: int(v) for k, v in counts.items() if k != "nll"} == {"masked": int(out["masked"]), "correct": int(out["correct"])}
    torch.testing.assert_close(out["nll"], counts["nll"])


def test_token_budget_chunks_give_the_same_loss_and_gradients():
    ids, attention, chosen = _tiny_batch(seed=4)
    results = []
    for budget in (0, 40):  # 40 tokens: one sequence per forward pass
        model = ExLMForMaskedLM(_tiny_mlm(seed=2), num_states=3, mask_token_id=3, token_budget=budget)
        out = model(*_masked(ids, attention, chosen))
        out["loss"].backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((out, grads))
    (whole, whole_grads), (chunked, chunked_grads) = results
    for key in ("loss", "nll", "correct", "masked"):
        torch.testing.assert_close(chunked[key].float(), whole[key].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_grads, whole_grads, rtol=1e-4, atol=1e-6)

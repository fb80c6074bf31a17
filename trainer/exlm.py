"""ExLM: expanded `[MASK]` states with dependency modeling (Zheng et al., arXiv 2501.13397).

Plain MLM replaces each chosen token by one `[MASK]` and predicts it independently. ExLM
instead expands every chosen position into k `[MASK]` states (and the start/end markers
likewise), runs the encoder on the longer input X', and scores the target
[start, masked tokens in order, end] as a path through a directed acyclic graph whose
vertices are the expanded states: a transition head gives each vertex a distribution over
the vertices after it, the MLM head gives each vertex a distribution over the vocabulary,
and the loss is -log of the sum over all paths of the product of transition and emission
probabilities (the DA-Transformer DAG loss), divided by the target length.

Everything here is torch only, vectorized over the batch, and runs on the inputs' device.

- `expand_batch` builds X' and the DAG's vertex/target index from a batch and the chosen
  mask positions (any selection: difference, random, whole-word, span).
- `ExLMForMaskedLM` wraps a Hugging Face masked LM: for absolute-position encoders (BERT,
  MiniLM, RoBERTa) the input embedding of a state is word + the ORIGINAL position's
  embedding + a learned copy-index embedding (row 0 fixed at zero, so unexpanded tokens
  are embedded exactly as before); no surgery on the HF model.
- `rotary_2d` is the paper's 2D rotary variant for rotary encoders (half of each head's
  dimensions rotate by the original position, half by the copy index).
- `dag_log_likelihood` / `dag_best_path` are the forward algorithm and Viterbi in log space.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

NEG_INF = float("-inf")

# Attribute names of the MLM head of common architectures: the head maps the encoder's hidden
# states to vocabulary logits (BERT family: `cls`; RoBERTa, XLM-R, CamemBERT: `lm_head`).
HEAD_ATTRIBUTES = ("cls", "lm_head")


# --------------------------------------------------------------------------------------
# Expansion
# --------------------------------------------------------------------------------------


@dataclass
class ExpandedBatch:
    """X' and the index of its DAG (B = batch, L' = expanded length, V = vertices, T = targets)."""

    input_ids: Tensor  # [B, L'] X': each chosen position k x mask_token_id, markers k x themselves
    attention_mask: Tensor  # [B, L'] 1 on real states, 0 on padding
    positions: Tensor  # [B, L'] original token position of each state (0 on padding)
    copy_index: Tensor  # [B, L'] 1..k for expanded states, 0 for unexpanded tokens and padding
    vertex_index: Tensor  # [B, V] where in X' each DAG vertex is: start states, mask states, end states
    vertex_mask: Tensor  # [B, V] bool, True on real vertices
    num_vertices: Tensor  # [B] k * (masked tokens + 2)
    targets: Tensor  # [B, T] [start token, masked tokens in order, end token] (pad_token_id after)
    target_mask: Tensor  # [B, T] bool, True on real targets
    target_lengths: Tensor  # [B] masked tokens + 2
    target_positions: Tensor  # [B, T] original position of each target token (-1 on padding)

    @property
    def masked_target_mask(self) -> Tensor:
        """[B, T] True on the masked-token targets (not the start/end markers, not padding)."""
        t = torch.arange(self.targets.shape[1], device=self.targets.device)
        return (t > 0) & (t < (self.target_lengths - 1).unsqueeze(1))


def _scatter_rows(values: Tensor, keep: Tensor, width: int, fill: int) -> Tensor:
    """Packs, per row, the `values` where `keep` is True to the left of a [B, width] tensor."""
    rows = values.shape[0]
    slot = torch.where(keep, keep.long().cumsum(1) - 1, width)  # dropped entries go to a spare column
    out = values.new_full((rows, width + 1), fill)
    out.scatter_(1, slot, values)
    return out[:, :width]


def expand_batch(
    input_ids: Tensor,
    attention_mask: Tensor,
    mask_positions: Tensor,
    *,
    num_states: int,
    mask_token_id: int,
    pad_token_id: int = 0,
) -> ExpandedBatch:
    """Expands the chosen positions and the start/end markers of each sequence into k states.

    `input_ids` are the ORIGINAL (unmasked) ids [B, L], right-padded; `attention_mask` [B, L];
    `mask_positions` [B, L] bool: the positions the mask selection chose. The first and the
    last attended token of each sequence are its start and end markers ([CLS]/[SEP] for BERT,
    <s>/</s> for RoBERTa); they cannot be chosen. Every chosen position becomes k
    `mask_token_id` states (the 80/10/10 replacement of plain MLM does not apply: ExLM
    masks every chosen token, as the reference does). No loop over the batch.
    """
    if num_states < 1:
        raise ValueError(f"num_states must be >= 1, got {num_states}")
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape or input_ids.shape != mask_positions.shape:
        raise ValueError(
            "input_ids, attention_mask and mask_positions must be [batch, length] tensors of one shape, got "
            f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(mask_positions.shape)}"
        )
    device = input_ids.device
    batch, length = input_ids.shape
    k = num_states
    attended = attention_mask.bool()
    mask_positions = mask_positions.bool()
    lengths = attended.sum(1)
    column = torch.arange(length, device=device).unsqueeze(0)
    if not torch.equal(attended, column < lengths.unsqueeze(1)):
        raise ValueError("expand_batch needs right-padded sequences (attention_mask a prefix of ones)")
    if bool((lengths < 2).any()):
        raise ValueError("every sequence needs at least its start and end markers (2 tokens)")
    markers = attended & ((column == 0) | (column == (lengths - 1).unsqueeze(1)))
    if bool((mask_positions & ~attended).any()) or bool((mask_positions & markers).any()):
        raise ValueError("mask_positions may only choose attended tokens between the start and end markers")

    expanded = mask_positions | markers  # the positions that become k states, and the DAG's targets
    repeats = torch.where(expanded, k, attended.long())  # padding drops out (0 copies)
    new_lengths = repeats.sum(1)
    expanded_length = int(new_lengths.max())

    # One flat repeat_interleave over the whole batch: state s comes from source token src[s].
    flat_repeats = repeats.flatten()
    src = torch.repeat_interleave(torch.arange(batch * length, device=device), flat_repeats)
    first_state = flat_repeats.cumsum(0) - flat_repeats  # flat index of each token's first state
    copy = torch.arange(src.numel(), device=device) - first_state[src]  # 0..k-1 within a token
    row = src // length
    col = (repeats.cumsum(1) - repeats).flatten()[src] + copy

    def place(values: Tensor, fill: int) -> Tensor:
        out = torch.full((batch, expanded_length), fill, dtype=values.dtype, device=device)
        out[row, col] = values
        return out

    src_is_expanded = expanded.flatten()[src]
    ids = torch.where(mask_positions.flatten()[src], mask_token_id, input_ids.flatten()[src])
    x_ids = place(ids, pad_token_id)
    x_attention = place(torch.ones_like(src), 0)
    x_positions = place(src % length, 0)
    x_copy = place(torch.where(src_is_expanded, copy + 1, 0), 0)

    num_targets = expanded.sum(1)
    num_vertices = num_targets * k
    is_vertex = x_copy > 0
    expanded_columns = torch.arange(expanded_length, device=device).expand(batch, -1)
    vertex_index = _scatter_rows(expanded_columns, is_vertex, int(num_vertices.max()), 0)
    vertex_mask = torch.arange(vertex_index.shape[1], device=device) < num_vertices.unsqueeze(1)
    target_width = int(num_targets.max())
    targets = _scatter_rows(input_ids, expanded, target_width, pad_token_id)
    target_positions = _scatter_rows(column.expand(batch, -1), expanded, target_width, -1)
    target_mask = torch.arange(target_width, device=device) < num_targets.unsqueeze(1)
    return ExpandedBatch(
        input_ids=x_ids,
        attention_mask=x_attention,
        positions=x_positions,
        copy_index=x_copy,
        vertex_index=vertex_index,
        vertex_mask=vertex_mask,
        num_vertices=num_vertices,
        targets=targets,
        target_mask=target_mask,
        target_lengths=num_targets,
        target_positions=target_positions,
    )


def expand_masked_batch(
    batch: dict[str, Tensor], *, num_states: int, mask_token_id: int, pad_token_id: int = 0
) -> ExpandedBatch:
    """`expand_batch` for a batch the masking step already ran on (`input_ids` masked, `labels`
    the original ids at the chosen positions and -100 elsewhere, as `apply_masking` returns)."""
    labels = batch["labels"]
    chosen = labels != -100
    original = torch.where(chosen, labels, batch["input_ids"])
    return expand_batch(
        original,
        batch["attention_mask"],
        chosen,
        num_states=num_states,
        mask_token_id=mask_token_id,
        pad_token_id=pad_token_id,
    )


# --------------------------------------------------------------------------------------
# 2D rotary positions (for rotary encoders)
# --------------------------------------------------------------------------------------


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rotary_1d(x: Tensor, position: Tensor, base: float) -> Tensor:
    """Standard RoPE (rotate-half layout) of x [..., L, d] by integer positions [..., L]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float64) / dim))
    angles = position.to(torch.float64).unsqueeze(-1) * inv_freq  # [..., L, d/2]
    angles = torch.cat((angles, angles), dim=-1)
    return x * angles.cos().to(x.dtype) + _rotate_half(x) * angles.sin().to(x.dtype)


def rotary_2d(x: Tensor, positions: Tensor, copy_index: Tensor, base: float = 10000.0) -> Tensor:
    """The paper's 2D rotary embedding of queries or keys x [..., L, head_dim].

    The first half of each head's dimensions rotates by the original token position, the
    second half by the copy index (0 for unexpanded tokens), so q.k depends only on the
    differences of both coordinates. `positions`/`copy_index` [..., L] broadcast against x's
    leading dimensions (e.g. [B, 1, L] for x [B, heads, L, d]). head_dim must be a multiple of 4.
    """
    if x.shape[-1] % 4:
        raise ValueError(f"2D rotary needs head_dim divisible by 4, got {x.shape[-1]}")
    by_position, by_copy = x.chunk(2, dim=-1)
    return torch.cat((_rotary_1d(by_position, positions, base), _rotary_1d(by_copy, copy_index, base)), dim=-1)


# --------------------------------------------------------------------------------------
# The DAG: transitions, forward algorithm, Viterbi
# --------------------------------------------------------------------------------------


def _logsumexp(x: Tensor, dim: int) -> Tensor:
    """logsumexp that gives -inf with a zero (not NaN) gradient when every term is -inf."""
    peak = x.detach().amax(dim=dim, keepdim=True)
    empty = torch.isneginf(peak)
    peak = peak.masked_fill(empty, 0.0)
    total = (x - peak).exp().sum(dim=dim, keepdim=True).masked_fill(empty, 1.0)
    return (total.log() + peak).masked_fill(empty, NEG_INF).squeeze(dim)


class TransitionHead(nn.Module):
    """Log transition matrix between the DAG's vertices, links only forward.

    As in the reference (DA-Transformer's link head): each vertex's feature is its final hidden
    state concatenated with a learned embedding of its position in X'; per head c,
    P_c(j | i) = softmax_j(q_ic . k_jc / sqrt(d)) over the vertices j after i; the heads are
    mixed by softmax gates computed from vertex i: P(j | i) = sum_c g_ic P_c(j | i).
    """

    def __init__(self, hidden_size: int, num_heads: int, max_positions: int, initializer_range: float = 0.02):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.position_embedding = nn.Embedding(max_positions, hidden_size)
        self.query = nn.Linear(2 * hidden_size, hidden_size)
        self.key = nn.Linear(2 * hidden_size, hidden_size)
        self.gate = nn.Linear(2 * hidden_size, num_heads)
        for module in (self.position_embedding, self.query, self.key, self.gate):
            nn.init.normal_(module.weight, std=initializer_range)
        for module in (self.query, self.key, self.gate):
            nn.init.zeros_(module.bias)

    def forward(self, vertex_hidden: Tensor, vertex_positions: Tensor, vertex_mask: Tensor) -> Tensor:
        """vertex_hidden [B, V, H], vertex_positions [B, V] (index in X'), vertex_mask [B, V] -> [B, V, V]."""
        batch, vertices, _ = vertex_hidden.shape
        if vertices and int(vertex_positions.max()) >= self.position_embedding.num_embeddings:
            raise ValueError(
                f"expanded sequence longer than the transition head's {self.position_embedding.num_embeddings} "
                "positions; build ExLMForMaskedLM with a larger max_expanded_positions"
            )
        features = torch.cat((vertex_hidden, self.position_embedding(vertex_positions)), dim=-1)
        # Scores and the DP run in float32 at least, also under fp16/bf16 (as the reference does).
        dtype = torch.promote_types(features.dtype, torch.float32)
        shape = (batch, vertices, self.num_heads, self.head_size)
        query = self.query(features).view(shape).to(dtype)
        key = self.key(features).view(shape).to(dtype)
        log_gates = F.log_softmax(self.gate(features).to(dtype), dim=-1)  # [B, V, C]
        scores = torch.einsum("bicf,bjcf->bijc", query, key) / math.sqrt(self.head_size)
        order = torch.arange(vertices, device=vertex_hidden.device)
        allowed = (order.view(1, -1, 1) < order.view(1, 1, -1)) & vertex_mask.unsqueeze(1) & vertex_mask.unsqueeze(2)
        # The last vertex (and padding) has no successor: normalize over anything, then zero out.
        no_successor = ~allowed.any(dim=2, keepdim=True)
        log_attention = F.log_softmax(scores.masked_fill(~(allowed | no_successor).unsqueeze(-1), NEG_INF), dim=2)
        log_attention = log_attention.masked_fill(~allowed.unsqueeze(-1), NEG_INF)
        return _logsumexp(log_attention + log_gates.unsqueeze(2), dim=-1)


def dag_log_likelihood(
    emissions: Tensor, log_transitions: Tensor, num_vertices: Tensor, target_lengths: Tensor
) -> Tensor:
    """log P(targets) summed over every path of the DAG (forward algorithm in log space).

    emissions [B, T, V]: log P(target t | vertex v); log_transitions [B, V, V]: log P(v -> w),
    -inf where there is no link. A path of sequence b visits exactly target_lengths[b] vertices
    in increasing order, from the first start state (vertex 0) to the last end state (vertex
    num_vertices[b] - 1), as in the reference. Loops over target positions only. Returns [B].
    """
    batch, targets, vertices = emissions.shape
    alpha = emissions.new_full((batch, vertices), NEG_INF)
    alpha[:, 0] = emissions[:, 0, 0]
    alphas = [alpha]
    for t in range(1, targets):
        alpha = _logsumexp(alpha.unsqueeze(2) + log_transitions, dim=1) + emissions[:, t]
        alphas.append(alpha)
    rows = torch.arange(batch, device=emissions.device)
    return torch.stack(alphas, dim=1)[rows, target_lengths - 1, num_vertices - 1]


@torch.no_grad()
def dag_best_path(
    emissions: Tensor, log_transitions: Tensor, num_vertices: Tensor, target_lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """Viterbi: the most probable path of target_lengths[b] vertices from vertex 0 to the last.

    Same inputs as `dag_log_likelihood` (emissions may be an expanded view). Returns the path
    [B, T] (vertex of each target step, -1 after the end) and its log score [B].
    """
    batch, targets, vertices = emissions.shape
    rows = torch.arange(batch, device=emissions.device)
    delta = emissions.new_full((batch, vertices), NEG_INF)
    delta[:, 0] = emissions[:, 0, 0]
    deltas, backpointers = [delta], []
    for t in range(1, targets):
        best, previous = (delta.unsqueeze(2) + log_transitions).max(dim=1)
        delta = best + emissions[:, t]
        deltas.append(delta)
        backpointers.append(previous)
    last_step = target_lengths - 1
    end_vertex = num_vertices - 1
    score = torch.stack(deltas, dim=1)[rows, last_step, end_vertex]
    path = torch.full((batch, targets), -1, dtype=torch.long, device=emissions.device)
    current = end_vertex
    for t in range(targets - 1, 0, -1):
        current = torch.where(last_step == t, end_vertex, current)
        active = t <= last_step
        path[:, t] = torch.where(active, current, -1)
        previous = backpointers[t - 1].gather(1, current.unsqueeze(1)).squeeze(1)
        current = torch.where(active, previous, current)
    path[:, 0] = 0
    return path, score


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------


@dataclass
class ExLMOutput:
    loss: Tensor  # scalar: mean over sequences of -log P(targets) / target length
    log_likelihood: Tensor  # [B] log P(targets) over all paths
    vertex_log_probs: Tensor  # [B, V, vocab] the MLM head's log-probabilities at each vertex
    log_transitions: Tensor  # [B, V, V]
    marker_log_prob: Tensor  # [B] log P(start | first vertex) + log P(end | last vertex): on every path


@torch.no_grad()
def predict_masked_tokens(output: ExLMOutput, expanded: ExpandedBatch) -> Tensor:
    """Reads a prediction for every target off the graph, without looking at the targets.

    Each vertex votes for its most probable token; Viterbi finds the path of exactly
    target_length vertices (the number of masked tokens is known, as in plain MLM) from the
    first start state to the last end state that maximizes transition x best-token
    probabilities; the t-th target's prediction is the best token of the t-th vertex on it.
    Returns [B, T] token ids (-1 on padding targets).
    """
    best_log_prob, best_token = output.vertex_log_probs.max(dim=-1)  # [B, V]
    targets = expanded.targets.shape[1]
    path, _ = dag_best_path(
        best_log_prob.unsqueeze(1).expand(-1, targets, -1),
        output.log_transitions,
        expanded.num_vertices,
        expanded.target_lengths,
    )
    return torch.where(path >= 0, best_token.gather(1, path.clamp_min(0)), -1)


@torch.no_grad()
def evaluation_counts(output: ExLMOutput, expanded: ExpandedBatch) -> dict[str, Tensor]:
    """Sums for held-out metrics comparable with plain MLM over the masked tokens.

    `nll`: -log P(the masked tokens) under the graph, summed over the batch: the all-path
    log-likelihood less the start and end markers' emissions, which every path shares (its
    first and last vertices are fixed), so only the masked tokens and the links between them
    count; `masked`: masked tokens; `correct`: masked tokens whose `predict_masked_tokens`
    prediction is right. Perplexity = exp(sum nll / sum masked), accuracy = sum correct / sum
    masked, over all held-out batches.
    """
    masked = expanded.masked_target_mask
    predictions = predict_masked_tokens(output, expanded)
    return {
        "nll": -(output.log_likelihood.detach() - output.marker_log_prob).sum(),
        "masked": masked.sum(),
        "correct": ((predictions == expanded.targets) & masked).sum(),
    }


def _mlm_head(model: nn.Module) -> nn.Module:
    """The module mapping final hidden states to vocabulary logits (BERT: `cls`, RoBERTa: `lm_head`)."""
    for name in HEAD_ATTRIBUTES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    raise TypeError(f"{type(model).__name__} has no `cls` or `lm_head` MLM head; ExLM needs a BERT/RoBERTa-style masked LM")


def expanded_lengths(attention_mask: Tensor, mask_positions: Tensor, num_states: int) -> Tensor:
    """[B] length of each sequence after `expand_batch`: n + (k - 1) * (chosen + 2)."""
    return attention_mask.sum(1) + (num_states - 1) * (mask_positions.sum(1) + 2)


class ExLMForMaskedLM(nn.Module):
    """A Hugging Face masked LM with ExLM's copy-index embedding and transition head.

    `mlm` stays an ordinary HF model; the extra ExLM parameters live in this module's other
    children. The encoder sees X' through `inputs_embeds` = word embedding + copy-index
    embedding, and `position_ids` = each state's ORIGINAL position, so the model's own
    absolute position embedding is added unchanged (no surgery on the HF model).

    `forward` takes a masked batch as the trainer has it (`input_ids`, `attention_mask`,
    `labels` with -100 where nothing was chosen) and returns the loss and the counts for
    perplexity and masked-token accuracy; `forward_expanded` is the objective on an
    `ExpandedBatch`. `token_budget` > 0 bounds the expanded tokens per forward pass: a
    larger batch runs in chunks of whole sequences, each under activation checkpointing,
    so activation memory is that of a `token_budget`-token batch while the loss and the
    gradients stay those of the whole batch (each chunk's forward is recomputed in backward;
    a chunk holds at least one sequence; dropout masks differ from an unchunked run's).
    """

    def __init__(
        self,
        mlm: nn.Module,
        num_states: int = 4,
        *,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        token_budget: int = 0,
        max_expanded_positions: int | None = None,
        num_link_heads: int | None = None,
    ):
        super().__init__()
        if num_states < 1 or token_budget < 0:
            raise ValueError(f"need num_states >= 1 and token_budget >= 0, got {num_states} and {token_budget}")
        config = mlm.config
        hidden = config.hidden_size
        self.mlm = mlm
        self.num_states = num_states
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else (getattr(config, "pad_token_id", None) or 0)
        self.token_budget = token_budget
        _mlm_head(mlm)  # fail early on a model without an MLM head
        # RoBERTa-style embeddings number positions from padding_idx + 1; BERT's from 0.
        padding_idx = getattr(getattr(mlm.base_model, "embeddings", None), "padding_idx", None)
        self.position_offset = padding_idx + 1 if padding_idx is not None else 0
        init_std = getattr(config, "initializer_range", 0.02)
        # padding_idx=0 keeps row 0 at zero and untrained: unexpanded tokens are embedded as before.
        self.copy_embedding = nn.Embedding(num_states + 1, hidden, padding_idx=0)
        nn.init.normal_(self.copy_embedding.weight, std=init_std)
        with torch.no_grad():
            self.copy_embedding.weight[0].zero_()
        # X' is at most k times the original length, which the encoder's positions bound.
        self.max_expanded_positions = max_expanded_positions or num_states * config.max_position_embeddings
        self.transitions = TransitionHead(
            hidden, num_link_heads or config.num_attention_heads, self.max_expanded_positions, init_std
        )

    def encode(self, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, copy_index: Tensor) -> Tensor:
        """Final hidden states [B, L', H] of X': word + copy-index embedding, original positions."""
        embeds = self.mlm.get_input_embeddings()(input_ids) + self.copy_embedding(copy_index)
        return self.mlm.base_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=positions + self.position_offset,
            token_type_ids=torch.zeros_like(input_ids),
        ).last_hidden_state

    def forward_expanded(self, expanded: ExpandedBatch) -> ExLMOutput:
        if int(expanded.copy_index.max()) > self.num_states:
            raise ValueError(f"batch was expanded into more states than this model's {self.num_states}")
        hidden = self.encode(expanded.input_ids, expanded.attention_mask, expanded.positions, expanded.copy_index)
        width = hidden.shape[-1]
        vertex_hidden = hidden.gather(1, expanded.vertex_index.unsqueeze(-1).expand(-1, -1, width))
        logits = _mlm_head(self.mlm)(vertex_hidden)
        vertex_log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        emissions = vertex_log_probs.gather(
            2, expanded.targets.unsqueeze(1).expand(-1, vertex_hidden.shape[1], -1)
        ).transpose(1, 2)  # [B, T, V]
        # Links and the DP in float32 even under bf16/fp16 autocast: log-space sums over many paths.
        with torch.autocast(vertex_hidden.device.type, enabled=False):
            vertex_hidden = vertex_hidden.to(self.transitions.query.weight.dtype)
            log_transitions = self.transitions(vertex_hidden, expanded.vertex_index, expanded.vertex_mask)
            log_likelihood = dag_log_likelihood(
                emissions, log_transitions, expanded.num_vertices, expanded.target_lengths
            )
        loss = -(log_likelihood / expanded.target_lengths).mean()
        rows = torch.arange(emissions.shape[0], device=emissions.device)
        markers = emissions[:, 0, 0] + emissions[rows, expanded.target_lengths - 1, expanded.num_vertices - 1]
        return ExLMOutput(loss, log_likelihood, vertex_log_probs, log_transitions, markers.detach())

    def _chunk(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
        """(sum over sequences of loss, nll, correct, masked) of a slice of the batch."""
        expanded = expand_masked_batch(
            {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels},
            num_states=self.num_states,
            mask_token_id=self.mask_token_id,
            pad_token_id=self.pad_token_id,
        )
        output = self.forward_expanded(expanded)
        counts = evaluation_counts(output, expanded)
        return output.loss * input_ids.shape[0], counts["nll"], counts["correct"], counts["masked"]

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor,
                masked_positions: Tensor | None = None, attends_all: bool = False) -> dict[str, Tensor]:
        """ExLM loss of a masked batch, and `nll`/`correct`/`masked` sums for held-out metrics.
        `masked_positions` and `attends_all` (the objectives' contract, for MaskedLM) are not used: the
        expansion reads the masks and the attention mask on the device."""
        if self.mask_token_id is None:
            raise ValueError("ExLMForMaskedLM needs mask_token_id to expand masked batches")
        batch = input_ids.shape[0]
        per_forward = batch
        if self.token_budget > 0:
            longest = int(expanded_lengths(attention_mask, labels != -100, self.num_states).max())
            per_forward = max(1, self.token_budget // longest)
        if per_forward >= batch:
            parts = [self._chunk(input_ids, attention_mask, labels)]
        else:
            run = self._chunk
            if torch.is_grad_enabled():  # keep only each chunk's inputs; recompute it in backward
                run = functools.partial(checkpoint, self._chunk, use_reentrant=False)
            parts = [
                run(input_ids[i : i + per_forward], attention_mask[i : i + per_forward], labels[i : i + per_forward])
                for i in range(0, batch, per_forward)
            ]
        loss, nll, correct, masked = (torch.stack(values).sum() for values in zip(*parts, strict=True))
        return {"loss": loss / batch, "nll": nll, "correct": correct, "masked": masked}

"""Answer several sessions' questions in one batch: one forward pass per step for all of them.

Every HERMES memory past its budget has the same length (prefix, summary slot, |M| video slots),
and decoding reads the weights once per step whatever the batch, so N answers cost little more
than one. `BatchDecoder` copies each session's memory (through `HermesCache.kv()`, never writing
into it) into one temporary `BatchCache`, side by side along the batch dimension, and decodes
greedily: each row until its own end or token limit. Rows of different lengths (a stream still
filling, a `full` cache, the other policy in Compare mode) are left-padded, and a 2D attention
mask hides the padding. Each row keeps its own positions (the session's `next_position` onwards,
on every axis for M-RoPE), so a row computes exactly what `StreamingSession.ask_stream` computes
alone. Rows that finish leave the batch; rows added between steps join at the next step, whose
input is then as wide as the longest joining question (the rows already decoding feed their one
token at its right end, after padding).

Hybrid models (Qwen3.5) also keep a fixed-size state per linear-attention layer; each row gets a
copy of its session's states (`BatchStateLayer`). A state has no columns to hide: a padding token
fed to a linear-attention layer would decay the state and shift its convolution window, so for
these models no row is ever padded. Rows join only an empty batch, together with the waiting rows
whose question has the same number of tokens (the same question asked of several sessions, as in
Compare mode or standing questions, batches whole); the others wait for the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers.cache_utils import LinearAttentionLayer

from hermes.engine.metrics import now_ms
from hermes.engine.session import MAX_NEW_TOKENS, AnswerUpdate, StreamingSession
from hermes.memory.buffer import BufferLayer
from hermes.memory.cache import HermesCache
from hermes.memory.hybrid import HybridCache
from hermes.models.base import VideoLM
from hermes.models.gemm import flush_denormals

# Room reserved after the longest row when a batch cache is (re)built, so that decoding rarely
# grows it: a few answers' worth of tokens.
ROOM = 128


class BatchLayer(BufferLayer):
    """One decoder layer of a batch: keys and values (rows, heads, tokens, dim) in a buffer with
    room to grow. Columns [start, length) are in use; every row has the same number of columns."""

    is_croppable = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a BatchLayer is filled from sessions' memories (BatchCache.extend) before the model runs")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("a BatchCache decodes greedily: rows join and leave through BatchDecoder")

    batch_repeat_interleave = batch_select_indices = reorder_cache

    # -- layout ---------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return 0 if self._k is None else self._k.shape[0]

    def nbytes(self) -> int:
        """Bytes of the keys and values in use (every row, padding included)."""
        return self.used_bytes()

    def reserve(self, n: int) -> None:
        """Room for `n` more columns; when the buffer must grow, half as much again (and ROOM) as held."""
        if self.length + n <= self._k.shape[-2]:
            return
        held = self.get_seq_length()
        size = max(held + n, held * 3 // 2) + ROOM
        self._k, self._v = (
            self._moved(t, t.new_empty(*t.shape[:-2], size, t.shape[-1]), 0) for t in (self._k, self._v)
        )
        self.start, self.length = 0, held

    def _moved(self, t: torch.Tensor, out: torch.Tensor, shift: int) -> torch.Tensor:
        """`out` (a new, larger buffer) with the columns in use of `t`'s rows written into its first
        rows, moved right by `shift` after zeros (padding must be finite: masked weights are 0, and
        0 * NaN is NaN)."""
        rows, held = t.shape[0], self.get_seq_length()
        out[:rows, ..., :shift, :] = 0
        out[:rows, ..., shift : shift + held, :] = t[..., self.start : self.length, :]
        return out

    def extend(self, memories: list[tuple[torch.Tensor, torch.Tensor]], width: int, room: int) -> None:
        """Add rows holding `memories` ((1, heads, L, dim) keys and values each, any lengths), the
        rows held first; every row is left-padded to the longest."""
        held = self.get_seq_length()
        longest = max([held] + [k.shape[-2] for k, _ in memories])
        size = longest + width + room
        old = self.rows
        buffers = []
        for i, t in enumerate((self._k, self._v)):
            ref = memories[0][i] if t is None else t
            out = ref.new_empty(old + len(memories), *ref.shape[1:-2], size, ref.shape[-1])
            if t is not None:
                self._moved(t, out, longest - held)
            for j, memory in enumerate(memories):
                n = memory[i].shape[-2]
                out[old + j, ..., : longest - n, :] = 0
                out[old + j, ..., longest - n : longest, :] = memory[i][0]
            buffers.append(out)
        self._k, self._v = buffers
        self.start, self.length = 0, longest
        self.is_initialized = True

    def select(self, rows: list[int], trim: int) -> None:
        """Keep only `rows` (indices, in order), and drop the first `trim` columns (padding in all of them)."""
        if not rows:
            self._k = self._v = None
            self.start = self.length = 0
            self.is_initialized = False
            return
        index = torch.as_tensor(rows, dtype=torch.long, device=self._k.device)
        self._k, self._v = (t.index_select(0, index) for t in (self._k, self._v))
        self.start += trim


class BatchStateLayer(LinearAttentionLayer):
    """One linear-attention layer of a batch: each row's copy of its session's convolution and
    recurrent states (rows first), which the model updates in place as it decodes."""

    def extend(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Add one row per session's states ({"conv": (1, ...), "recurrent": (1, ...)}), copied."""
        for name, held in (("conv", self.conv_states), ("recurrent", self.recurrent_states)):
            rows = [held[0]] if held[0] is not None else []
            held[0] = torch.cat(rows + [s[name] for s in states])
        self.conv_kernel_size[0] = self.conv_states[0].shape[-1]
        self.device, self.dtype = self.conv_states[0].device, self.conv_states[0].dtype
        self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
        self.has_previous_state[0] = True  # every row continues a memory that has seen tokens

    def select(self, rows: list[int], trim: int = 0) -> None:
        """Keep only `rows` (indices, in order); a state has no columns, so `trim` is nothing to it."""
        if not rows:
            self.conv_states[0] = self.recurrent_states[0] = None
            self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = False
            return
        index = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        for held in (self.conv_states, self.recurrent_states):
            held[0] = held[0].index_select(0, index)

    def reserve(self, n: int) -> None:
        """A state needs no room for more tokens."""

    def nbytes(self) -> int:
        """Bytes of the rows' states."""
        return sum(
            t.numel() * t.element_size() for t in (self.conv_states[0], self.recurrent_states[0]) if t is not None
        )


class BatchCache(HybridCache):
    """A temporary transformers Cache of several sessions' memories side by side (dim 0),
    left-padded to one length. It is built from copies: the sessions' memories are never written.
    `linear` lists a hybrid model's linear-attention layers, which hold states instead of keys."""

    def __init__(self, num_layers: int, linear: list[int] | None = None) -> None:
        linear = set(linear or ())
        super().__init__(layers=[BatchStateLayer() if i in linear else BatchLayer() for i in range(num_layers)])
        self.kv_layers = [layer for layer in self.layers if isinstance(layer, BatchLayer)]
        self.state_layers = [layer for layer in self.layers if isinstance(layer, BatchStateLayer)]

    @property
    def rows(self) -> int:
        return self.kv_layers[0].rows

    def extend(self, memories: list[HermesCache], width: int) -> None:
        """Add one row per memory (its keys and values, and its states), room for `width` + ROOM more columns."""
        kv = [memory.kv() for memory in memories]
        for i, layer in enumerate(self.kv_layers):
            layer.extend([rows[i] for rows in kv], width, ROOM)
        for i, layer in enumerate(self.state_layers):
            layer.extend([memory.state_layers[i].states() for memory in memories])

    def select(self, rows: list[int], trim: int = 0) -> None:
        for layer in self.layers:
            layer.select(rows, trim)

    def reserve(self, n: int) -> None:
        for layer in self.layers:
            layer.reserve(n)

    def nbytes(self) -> int:
        """Bytes of the keys and values held, padding included, and of the states."""
        return sum(layer.nbytes() for layer in self.layers)


@dataclass(eq=False)
class BatchRow:
    """One question on one session, in a batch. `tag` is the caller's, to route the updates."""

    session: StreamingSession
    question: str
    max_new_tokens: int
    ids: torch.Tensor  # (1, n) the question's token ids
    tag: object = None
    started_ms: float = 0.0
    position: int = 0  # where the next token fed goes: after the question, then after each answer token
    generated: list[int] = field(default_factory=list)
    update: AnswerUpdate | None = None  # set with the first token
    logprobs: torch.Tensor | None = None  # (vocab,) of the first token, as `first_token_logprobs` gives
    first_ms: float = 0.0

    @property
    def tokens(self) -> int:
        return len(self.generated)


class BatchDecoder:
    """Greedy decoding of many sessions' questions in one batch, rows joining and leaving between steps.

    `add` queues a question (checked at once: QuestionError); `step` runs one forward pass for the
    whole batch, the joining rows' questions included, and returns the updates it made, in row
    order: per row, the answer so far after each token, and a last one with `done` (the same
    `AnswerUpdate`s that `StreamingSession.ask_stream` yields; the finished answer is recorded on
    its session as there). `drop` takes a row out unfinished. No session's memory is changed.

    `max_bytes` bounds the batch's copies of the memories: a row whose memory would pass it waits,
    in order, until rows leave (a row always joins an empty batch).
    """

    def __init__(self, lm: VideoLM, max_bytes: int | None = None) -> None:
        self.lm = lm
        self.max_bytes = max_bytes
        self.rows: list[BatchRow] = []  # in the batch, in cache row order
        self.joining: list[BatchRow] = []  # added, to join at the next step
        self._cache: BatchCache | None = None
        self._mask: torch.Tensor | None = None  # (rows, columns) bool: False where padding
        self._padded = False  # whether the mask has a False anywhere (else the model needs none)

    def __len__(self) -> int:
        """Rows in the batch or joining it."""
        return len(self.rows) + len(self.joining)

    def add(
        self, session: StreamingSession, question: str, max_new_tokens: int = MAX_NEW_TOKENS, tag: object = None
    ) -> BatchRow:
        """Queue `question` on `session` to join the batch at the next step. TTFT runs from here."""
        if session.lm is not self.lm:
            raise ValueError("every session of a batch must run on the batch's model")
        if not session.policy.question.batchable:
            raise ValueError(
                f"{session.policy.name} questions are answered one at a time (StreamingSession.ask_stream): its "
                "question-time step brings in its own tokens for each question, so a row would not be a copy of "
                "its memory"
            )
        q = session.reader.check_question(question)
        row = BatchRow(session, q, max_new_tokens, self.lm.question_ids(q), tag, now_ms(self.lm.device))
        self.joining.append(row)
        return row

    def drop(self, row: BatchRow) -> None:
        """Take `row` out of the batch unfinished (its viewer went away); its answer is not recorded."""
        if row in self.joining:
            self.joining.remove(row)
        elif row in self.rows:
            self._leave({row})

    def clear(self) -> None:
        """Drop every row, joining ones included, and free the batch cache (after a failed step)."""
        self.rows, self.joining = [], []
        self._free()

    def _free(self) -> None:
        self._cache = self._mask = None
        self._padded = False

    @torch.inference_mode()
    def step(self) -> list[tuple[BatchRow, AnswerUpdate]]:
        """One forward pass: the joining rows' questions and every other row's last token."""
        joining = self._admitted()
        if not joining and not self.rows:
            return []
        device = self.lm.device
        width = max((row.ids.shape[-1] for row in joining), default=1)
        if joining:
            self._join(joining, width)
        input_ids, positions, block = [], [], []
        for row in self.rows:
            if row.update is None:  # joining now: its question, right-aligned
                ids = row.ids[0]
                pos = row.position + torch.arange(ids.numel())
                row.position += ids.numel()
            else:  # decoding: its last token
                ids = torch.tensor([row.generated[-1]], device=device)
                pos = torch.tensor([row.position])
                row.position += 1
            pad = width - ids.numel()
            # Padding repeats the first token and its position: any valid input would do, it is masked out.
            input_ids.append(torch.cat([ids[:1].expand(pad), ids]))
            positions.append(self.lm.position_ids(torch.cat([pos[:1].expand(pad), pos])[None].to(device)))
            block.append(torch.arange(width) >= pad)
        new_columns = torch.stack(block).to(device)
        self._padded = self._padded or not bool(new_columns.all())
        self._mask = torch.cat([self._mask, new_columns], dim=1)
        self._cache.reserve(width)
        flush_denormals()
        out = self.lm.model(
            input_ids=torch.stack(input_ids),
            attention_mask=self._mask if self._padded else None,
            position_ids=torch.cat(positions, dim=-2),
            **{self.lm.cache_argument: self._cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return self._advance(out.logits[:, -1])

    def _admitted(self) -> list[BatchRow]:
        """The waiting rows that join at this step, in order, within `max_bytes`; for a hybrid model
        only into an empty batch, and only rows whose questions have the first one's length (no
        row is padded: see the module's note)."""
        waiting = self.joining
        if self.lm.linear_layers:
            if self.rows or not waiting:
                return []
            width = waiting[0].ids.shape[-1]
            waiting = [row for row in waiting if row.ids.shape[-1] == width]
        if self.max_bytes is not None:
            held = self._cache.nbytes() if self._cache is not None else 0
            taken = 0
            for row in waiting:
                need = row.session.memory.copy_bytes()
                if (self.rows or taken) and held + need > self.max_bytes:
                    break
                held += need
                taken += 1
            waiting = waiting[:taken]
        self.joining = [row for row in self.joining if row not in waiting]
        return waiting

    def _join(self, joining: list[BatchRow], width: int) -> None:
        """Copy the joining rows' memories into the batch cache (left-padded) and extend the mask."""
        memories = []
        for row in joining:
            # A chunk or a reader that never finished may have left scratch tokens: not part of the memory.
            row.session.memory.discard()
            memories.append(row.session.memory)
            row.position = row.session.memory.next_position
        if self._cache is None:
            self._cache = BatchCache(self.lm.num_layers, self.lm.linear_layers)
        held = self._cache.get_seq_length()
        lengths = [memory.get_seq_length() for memory in memories]
        self._cache.extend(memories, width)
        longest = max([held, *lengths])
        device = self.lm.device
        mask = torch.zeros(len(self.rows) + len(joining), longest, dtype=torch.bool, device=device)
        if self._mask is not None:
            mask[: len(self.rows), longest - held :] = self._mask
        for j, n in enumerate(lengths):
            mask[len(self.rows) + j, longest - n :] = True
        self._padded = self._padded or not bool(mask.all())
        self._mask = mask
        self.rows.extend(joining)

    def _advance(self, logits: torch.Tensor) -> list[tuple[BatchRow, AnswerUpdate]]:
        """Take each row's next token from its logits (rows, vocab); the updates, and rows that finish leave."""
        device = self.lm.device
        tokens = logits.argmax(dim=-1).tolist()
        now = now_ms(device)
        eos = self.lm.eos_token_ids
        updates: list[tuple[BatchRow, AnswerUpdate]] = []
        finished: set[BatchRow] = set()
        for i, row in enumerate(self.rows):
            token = tokens[i]
            if row.update is None:  # the first token, as StreamingSession.ask_stream reads it
                logp = torch.log_softmax(logits[i].float(), dim=-1)
                token = int(logp.argmax())
                row.logprobs, row.first_ms = logp, now
                row.update = row.session.reader.first_update(row.question, logp, now - row.started_ms)
            if token in eos or row.tokens >= row.max_new_tokens:
                finished.add(row)
                continue
            row.generated.append(token)
            row.update.text, row.update.tokens = self.lm.decode(row.generated), row.tokens
            updates.append((row, replace(row.update)))
            if row.tokens == row.max_new_tokens:
                finished.add(row)
        for row in self.rows:
            if row in finished:
                updates.append((row, self._finish(row)))
        if finished:
            self._leave(finished)
        return updates

    def _finish(self, row: BatchRow) -> AnswerUpdate:
        """The last update of a finished row, recorded on its session as `ask_stream` records it."""
        update = row.update.finished(row.tokens, row.first_ms, now_ms(self.lm.device))
        row.session.reader.record_answer(update)
        return replace(update)

    def _leave(self, gone: set[BatchRow]) -> None:
        """Rows leave the batch; columns that are padding in every remaining row go too."""
        staying = [i for i, row in enumerate(self.rows) if row not in gone]
        self.rows = [self.rows[i] for i in staying]
        if not staying:
            self._free()  # rows still waiting to join start a new one
            return
        mask = self._mask[staying]
        used = mask.any(dim=0)
        trim = int(used.to(torch.uint8).argmax())  # columns before the first any row uses
        self._mask = mask[:, trim:]
        self._padded = not bool(self._mask.all())
        self._cache.select(staying, trim)

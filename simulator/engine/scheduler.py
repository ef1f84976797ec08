"""Schedulers: which sequences each iteration runs.

- ``static``: when the engine is idle, it takes up to ``max_num_seqs`` waiting requests whose
  whole KV cache (prompt + output) fits, prefills them together and decodes until the last
  one finishes; nobody joins a running batch. Sequences that finish early leave (their
  slots stay empty). Memory is reserved up front, so nothing is ever preempted.
- ``continuous`` (Orca / vLLM): every iteration, waiting requests are admitted first-come
  first-served while their prompt's blocks fit and fewer than ``max_num_seqs`` run; an
  iteration that admits any runs their prefills alone (prefill first, decodes wait), else
  all running sequences decode one token. When decode needs a block and none is free, the
  newest running request is preempted (its blocks freed) and recomputed later.
- ``chunked`` (Sarathi-Serve / vLLM chunked prefill): every iteration has a budget of
  ``max_batched_tokens`` tokens; all running decodes take one token each, then the rest of
  the budget goes to prefill chunks (unfinished prefills first, then new admissions).
  Prefill and decode tokens share the iteration.
- ``prefill-first`` (SGLang's default; its ``--enable-mixed-chunk`` is ``chunked``): an iteration that
  can continue or start a prefill runs prefill chunks alone, filling ``max_batched_tokens``
  (unfinished prefills first, then new admissions, the last cut to fit; SGLang's
  ``chunked_prefill_size``), and the running sequences wait; only an iteration with no prefill to
  run decodes them (``get_next_batch_to_run`` in sglang/srt/managers/scheduler.py: "Run prefill first
  if possible"). Unlike ``continuous``, a prompt longer than the budget is cut into chunks.

KV admission (``kv_admission``), for ``continuous``, ``chunked`` and ``prefill-first``:

- ``incremental`` (vLLM, SGLang): a request is admitted when its prompt's blocks fit; blocks are
  added as it decodes, and a decode that finds none free preempts the newest request.
- ``reserve`` (TensorRT-LLM's default capacity policy, ``GUARANTEED_NO_EVICT``): a request is
  admitted only when the blocks of its whole prompt plus its maximum output fit, and they are
  reserved at once, so nothing is ever preempted (fewer sequences run, none is recomputed).
- ``fit`` (SGLang for requests that ignore EOS, without a prefix cache: ``add_one_req_ignore_eos`` in
  sglang/srt/managers/schedule_policy.py): blocks grow as with ``incremental``, but a request is
  admitted only if, with it, the outputs still to come fit as requests finish and free their
  tokens: the running requests and the newcomer sorted by tokens left, for each ``i`` the free
  tokens (after the newcomer's prompt) plus those held by the ``i`` requests with fewer left must
  reach the next one's tokens left times the ``n - i`` still running. The waiting request's own
  tokens left do not fall as the others decode, so the test can turn true at any tick: while a
  request waits, the engine decodes one tick at a time and tests it before each.

Policies decide; :mod:`simulator.engine.engine` keeps the state and charges the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError

SCHEDULERS = ("static", "continuous", "chunked", "prefill-first")
KV_ADMISSIONS = ("incremental", "reserve", "fit")

# vLLM's default cap on running sequences, and its token budget per iteration when
# chunked prefill is on (vLLM V0 default max_num_batched_tokens with chunked prefill).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_CHUNKED_BUDGET = 2048
# SGLang's chunked_prefill_size on GPUs of 25 GB or more (sglang/srt/server_args.py, 0.4).
DEFAULT_PREFILL_FIRST_BUDGET = 8192


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling settings; ``max_batched_tokens`` None means no per-iteration token budget."""

    scheduler: str = "continuous"
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_batched_tokens: int | None = None
    block_size: int = 16
    prefix_caching: bool = False
    """keep and reuse the KV blocks of shared prompt prefixes (simulator.engine.prefix_cache)"""
    prefix_cache_warm: bool = False
    """with ``prefix_caching``: every prefix of the workload starts resident (its prompts were served before)"""
    kv_admission: str = "incremental"
    """``incremental`` (blocks as sequences grow, preemption), ``reserve`` (whole request at admission) or ``fit``
    (blocks as sequences grow, admitted only when every output still to come fits: SGLang's check)"""

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise InputError(f"--scheduler: unknown {self.scheduler!r}; allowed: {', '.join(SCHEDULERS)}")
        if self.kv_admission not in KV_ADMISSIONS:
            raise InputError(f"--kv-admission: unknown {self.kv_admission!r}; allowed: {', '.join(KV_ADMISSIONS)}")
        if self.prefix_cache_warm and not self.prefix_caching:
            raise InputError("--prefix-cache-warm needs --prefix-caching (a warm cache is the prefix cache's)")
        if self.max_num_seqs < 1:
            raise InputError(f"--max-num-seqs: must be >= 1 (got {self.max_num_seqs})")
        if self.block_size < 1:
            raise InputError(f"--block-size: must be >= 1 token (got {self.block_size})")
        if self.scheduler == "chunked" and self.max_batched_tokens is None:
            object.__setattr__(self, "max_batched_tokens", DEFAULT_CHUNKED_BUDGET)
        if self.scheduler == "prefill-first" and self.max_batched_tokens is None:
            object.__setattr__(self, "max_batched_tokens", DEFAULT_PREFILL_FIRST_BUDGET)
        budget = self.max_batched_tokens
        if budget is not None and budget < 1:
            raise InputError(f"--max-batched-tokens: must be >= 1 (got {budget})")
        if self.scheduler == "chunked" and budget is not None and budget < self.max_num_seqs:
            raise InputError(
                f"--max-batched-tokens {budget} is below --max-num-seqs {self.max_num_seqs}: with --scheduler chunked "
                f"every running decode needs a token of the budget (as in vLLM, budget >= max-num-seqs)"
            )

    @property
    def prefills_in_pieces(self) -> bool:
        """True when a prompt may take several iterations (chunked prefill, mixed or not; a static batch under a
        per-pass budget), so unfinished prefills are tracked."""
        return self.scheduler in ("chunked", "prefill-first") or (
            self.scheduler == "static" and self.max_batched_tokens is not None)

    @property
    def fit_admission(self) -> bool:
        """True when ``fit`` decides admission (static batches reserve whole requests whatever the setting)."""
        return self.scheduler != "static" and self.kv_admission == "fit"

    @property
    def incremental_blocks(self) -> bool:
        """True when blocks are allocated as sequences grow (static and ``reserve`` take the whole request up front)."""
        return self.scheduler != "static" and self.kv_admission in ("incremental", "fit")


@dataclass
class Chunk:
    """``tokens`` prompt tokens of request ``rid`` on top of ``cached`` already in its cache; ``emits`` on the last chunk."""

    rid: int
    tokens: int
    cached: int
    emits: bool


def plan_static(state) -> list[Chunk] | None:
    """Prefill chunks of a new batch when idle, [] to decode the running batch, None when there is nothing to do.

    With a token budget (``max_batched_tokens``: an engine whose forward pass carries at most that many
    tokens, EngineProfile's ``scheduler.pass_tokens``) the batch's prompts go through in passes of at most
    that many tokens, in admission order, and the batch decodes once every prompt is in.
    """
    budget = state.config.max_batched_tokens
    if budget is not None and state.partial_prefills():
        return _continue_prefills(state, budget)[0]
    if state.running:
        return []
    admitted: list[int] = []  # request ids
    while state.waiting and len(admitted) < state.config.max_num_seqs and state.admissible(state.waiting[0]):
        admitted.append(state.admit(state.waiting[0]))
    if not admitted:
        return None
    if budget is not None:
        return _continue_prefills(state, budget)[0]
    # A prefix-cache hit starts the prefill at the cached tokens (prefilled is set on admission).
    return [Chunk(rid, int(state.target[rid] - state.prefilled[rid]), int(state.prefilled[rid]), True) for rid in admitted]


def _continue_prefills(state, room: int) -> tuple[list[Chunk], int]:
    """Chunks of the unfinished prefills, in admission order, filling at most ``room`` tokens; and the room left."""
    chunks: list[Chunk] = []
    for rid in state.partial_prefills():
        if room <= 0:
            break
        done = int(state.prefilled[rid])
        left = int(state.target[rid]) - done
        take = min(left, room)
        chunks.append(Chunk(rid, take, done, take == left))
        room -= take
    return chunks, room


def plan_continuous(state) -> list[Chunk] | None:
    """Prefills of newly admitted requests (alone), else [] to decode, else None."""
    budget = state.config.max_batched_tokens
    chunks: list[Chunk] = []
    tokens = 0
    while state.waiting and state.running < state.config.max_num_seqs and state.admissible(state.waiting[0]):
        head = state.waiting[0]
        need = int(state.target[head])
        if budget is not None and chunks and tokens + need > budget:
            break
        state.admit(head)
        cached = int(state.prefilled[head])
        chunks.append(Chunk(head, need - cached, cached, True))
        tokens += need - cached
    if chunks:
        return chunks
    return [] if state.decoding else None


def _admit_chunks(state, chunks: list[Chunk], room: int) -> int:
    """Admit waiting requests (first come, first served) into ``chunks`` while ``room`` tokens are left, the last
    one cut to fit; returns the room left."""
    while room > 0 and state.waiting and state.running < state.config.max_num_seqs and state.admissible(state.waiting[0]):
        rid = state.admit(state.waiting[0])
        cached = int(state.prefilled[rid])
        left = int(state.target[rid]) - cached
        take = min(left, room)
        chunks.append(Chunk(rid, take, cached, take == left))
        room -= take
    return room


def plan_chunked(state, admit: bool = True) -> list[Chunk] | None:
    """Decodes plus prefill chunks filling the token budget; [] for decode only; None when idle.

    The caller has already made room for this iteration's decode blocks (preempting if needed,
    in which case ``admit`` is False: no new request starts in that iteration).
    """
    chunks, room = _continue_prefills(state, state.config.max_batched_tokens - state.decoding)
    if admit:
        _admit_chunks(state, chunks, room)
    if chunks or state.decoding:
        return chunks
    return None


def plan_prefill_first(state) -> list[Chunk] | None:
    """Prefill chunks alone, filling the token budget (unfinished prefills first); else [] to decode; None when idle."""
    chunks, room = _continue_prefills(state, state.config.max_batched_tokens)
    _admit_chunks(state, chunks, room)
    if chunks:
        return chunks
    return [] if state.decoding else None


POLICIES = {"static": plan_static, "continuous": plan_continuous, "chunked": plan_chunked, "prefill-first": plan_prefill_first}

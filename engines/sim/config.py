"""Every setting of one simulator replica, with its default and unit, in one place.

Performance constants live in :class:`engines.sim.perf.PerfModel` (with their sources); the
defaults here describe the reference deployment (Llama-3-70B, TP4 on H100-class GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engines.sim.agent import AfterToolResult, ToolArguments, TurnPolicy
from engines.sim.faults import NO_FAULTS, Faults
from engines.sim.perf import PerfModel


@dataclass(slots=True)
class SimConfig:
    """Replica settings; built by :mod:`engines.sim.cli` or directly by tests.

    - ``max_model_len`` (tokens): prompt + output limit per request (vLLM ``--max-model-len``).
    - ``max_num_seqs``: running sequences per step; 256 is vLLM's default on H100-class GPUs.
    - ``max_num_batched_tokens``: prefill + decode tokens per step (chunked prefill budget);
      8192 is vLLM V1's default for online serving on H100-class GPUs.
    - ``num_gpu_blocks`` x ``block_size`` (16, vLLM's default): KV capacity. 25,000 blocks =
      400k tokens: ~130 GB of KV at 320 KiB/token (Llama-3-70B, bf16) left on 4 x 80 GB at
      ``gpu_memory_utilization`` 0.9 after ~141 GB of weights and activations.
    - ``output_tokens``: natural completion length when the request sets no ``max_tokens``
      (finish_reason "stop"); with a lower ``max_tokens`` the completion is cut ("length").
    - ``time_scale``: multiplies every model delay (0: no delay). Fault delays are not scaled.
    - ``scheduling_policy``: vLLM's ``--scheduling-policy``: ``fcfs`` (FIFO waiting queue; a
      non-zero request ``priority`` is a 400, as in vLLM) or ``priority`` (waiting queue by
      ``priority``, lower first, then arrival).
    - ``after_tool_result``: the answer after a tool result: ``text`` (agent loops end),
      ``call`` (another call), ``mix`` (a call for half the prompts, by prompt and seed);
      ``tool_arguments``: ``required`` properties only, or ``all`` (``engines.sim.agent``).
    - ``preemption``: allocate decode blocks as tokens are generated and preempt the newest
      running request by recompute when the pool runs out (vLLM V1); off: each request
      reserves its prompt + whole output at admission and is never preempted.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    port_file: str | None = None  # where to write the bound port (engines.procs)
    model: str = "sim-model"
    max_model_len: int = 32768
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 25000
    output_tokens: int = 64
    time_scale: float = 1.0
    seed: int = 0
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    preemption: bool = False
    enable_prompt_tokens_details: bool = True
    legacy_error_shape: bool = False
    # per-request ``sim_faults`` body fields honoured (``--accept-sim-faults``); off: a body
    # that carries one is refused 400, so no client can script (or crash) a shared replica
    accept_sim_faults: bool = False
    slow_start_s: float = 0.0
    after_tool_result: AfterToolResult = "text"
    tool_arguments: ToolArguments = "required"
    perf: PerfModel = field(default_factory=PerfModel)
    faults: Faults = NO_FAULTS

    def turn_policy(self) -> TurnPolicy:
        """The agent-turn settings of this replica (``engines.sim.agent.TurnPolicy``)."""
        return TurnPolicy(self.after_tool_result, self.tool_arguments, self.seed)

"""TEST DOUBLE: vLLM's CPU communicator, with shared memory between ranks of one host only.

vLLM's CPU build moves a tensor-parallel or pipeline group's tensors through a shared
memory segment (`_CPUSHMDistributed`) whenever the group's ranks agree on a segment name,
as if every rank ran on one machine; across the fleet's hosts, each with its own
/dev/shm, the second rank finds no segment ("open shm in SHMManager failed. errno: 2")
and the engine never starts. The GPU build this stands in for shares memory (CUDA IPC)
only within a node and talks across nodes over the network (NCCL). So does this: the
group uses shared memory when vLLM's own test finds every rank on the first rank's host
(`in_the_same_node_as`, a segment only that host can open), and torch.distributed over
the network (gloo) otherwise.
"""

from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.distributed.parallel_state import in_the_same_node_as


class NodeLocalShmCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        # Collective over the group's gloo group: every rank of the group calls it, in
        # the same order, as CpuCommunicator.__init__ does for this method.
        same_host = all(in_the_same_node_as(self.cpu_group, source_rank=0))
        return super()._all_group_ranks_share_shm_group_name() and same_host

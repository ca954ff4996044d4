"""When the gateway's waker starts one more warm gang (maxReplicas, issue 36): the queue
per serving gang it scales out on, and how long that queue must last. Two readers: the
waker's configuration (idle_stop.waker_config) and the alert that says the pool cannot
grow (metrics, VllmPoolAtMaxReplicas). Here, with its reasoning, so that each imports it
without importing the other.
"""

# When the gateway's waker starts one more warm gang: requests waiting per serving gang above
# this, at every look for this long (scripts/gateway/vllm-cluster-waker scale_decision). It
# reads vLLM's vllm:num_requests_waiting, which vLLM sets from its scheduler's
# len(self.waiting) (vllm/v1/metrics/loggers.py, PrometheusStatLogger.record:
# gauge_scheduler_waiting.set(scheduler_stats.num_waiting_reqs); vllm/v1/core/sched/
# scheduler.py make_stats: num_waiting_reqs=len(self.waiting)). The V1 scheduler moves a
# request from waiting to running at every step unless the running batch holds max_num_seqs
# requests, the KV cache has no room for it, or the step's token budget
# (max_num_batched_tokens) is spent (scheduler.py schedule(): "while self.waiting and
# token_budget > 0: if len(self.running) == self.max_num_running_reqs: break", then the KV
# allocation, which may fail). A spent token budget clears at the next step, milliseconds
# later; a full batch or a full cache clears only as requests finish. So the gauge counts the
# requests beyond what the engine can run, and a queue still there at every scrape for a
# minute (four or more of Prometheus's looks, 15 s apart: metrics.SCRAPE_INTERVAL) is an
# engine that is full, not a burst of long prompts. Every such request waits a whole
# running request's time before its first token, and a wake takes minutes: the threshold
# is no request waiting per serving gang (more than 0), and the hold time, not a larger
# threshold, keeps a short burst from starting a gang. (A fraction of max_num_seqs, as the
# issue suggests, would let 64 or more requests queue per gang at vLLM's defaults before
# anything starts: minutes of added latency on top of the wake.)
SCALE_OUT_WAITING_PER_GANG = 0.0
SCALE_OUT_HOLD_SECONDS = 60

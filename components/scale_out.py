"""When the gateway's waker starts one more warm gang (maxReplicas, issue 36): the queue
per serving gang it scales out on, and how long that queue must last; and when it parks one
again (issue 48): the share of one gang fewer's capacity the load must fit in, and for how
long. Two readers: the waker's configuration (idle_stop.waker_config) and the alert that
says the pool cannot grow (metrics, VllmPoolAtMaxReplicas). Here, with its reasoning, so
that each imports it without importing the other.
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

# When the gateway's waker parks a serving warm gang again (issue 48; scripts/gateway/
# vllm-cluster-waker scale_in_decision): when the load, requests running plus waiting summed
# over the n serving gangs, stayed at or below SCALE_IN_FRACTION x (n - 1) x max_num_seqs at
# every look for idleStopMinutes. max_num_seqs is what one gang's engine runs at once
# (components/engine_capacity.py, waker.json's gang_max_num_seqs); both figures are vLLM's
# gauges of its scheduler, set from its stats: len(self.running) and
# len(self.waiting) (vllm/v1/metrics/loggers.py, PrometheusStatLogger.record:
# gauge_scheduler_running.set(scheduler_stats.num_running_reqs),
# gauge_scheduler_waiting.set(scheduler_stats.num_waiting_reqs); vllm/v1/core/sched/
# scheduler.py make_stats), read per gang from Prometheus on the gateway.
#
# The hysteresis. Scale-out needs requests waiting on the serving gangs, more than 0 per
# gang at every look for SCALE_OUT_HOLD_SECONDS: their engines admit no more (a full batch
# of max_num_seqs or a full KV cache, above), a load above what n gangs run, about n x
# max_num_seqs. Scale-in needs the load at or below half of what one gang fewer runs: after
# it, the n - 1 gangs left run at most half their slots and nothing waits, so the load must
# double, and hold for the scale-out's minute, before the waker starts a gang again. A
# fraction of 1 would leave the gangs full right after a scale-in, and the next request
# would queue: a wake, idleStopMinutes later a park, and so on, every wake minutes of
# latency and a stop/start billed. Half, not less: nginx's least_conn balances
# connections, not engine slots, so one gang can carry more than its share for a while,
# and an engine's KV cache can fill before max_num_seqs run (long prompts: the scheduler
# stops admitting when the KV allocation fails, above), which a fraction leaves room for;
# less than half keeps a gang billed for a load one gang fewer runs without a queue.
#
# The window is idleStopMinutes (no constant of its own): the time the user chose after
# which a stop now and a wake at the next request are worth it, which is exactly what a
# scale-in trades (the next peak waits the hold and a wake: `plan` prints it). A look with
# a load above the limit, a look without figures (Prometheus down, a serving gang's engine
# not scraped), a gang that starts or stops serving, and a gang on its way up (a wake
# asked) all start the window again: no scale-in right after a scale-out until the new
# gang has served for the whole window. The last serving gang (replicas 0) keeps the idle
# rule instead: no client request at all for idleStopMinutes, since no gang would be left.
SCALE_IN_FRACTION = 0.5

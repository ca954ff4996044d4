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
# vllm-cluster-waker scale_in_decision): when the load fit on one gang fewer at every look
# for idleStopMinutes, which takes three things at each look: (a) no request waits on any
# serving gang (none above SCALE_OUT_WAITING_PER_GANG: a queue is an engine that admits no
# more, and the gangs left would queue more); (b) requests running plus waiting, summed over
# the n serving gangs, at or below SCALE_IN_FRACTION x (n - 1) x max_num_seqs; and (c) the KV
# cache projected onto one gang fewer fits: vLLM's vllm:kv_cache_usage_perc (0..1 per engine,
# "1 means 100 percent usage", vllm/v1/metrics/loggers.py; the waker reads max by gang),
# summed over the serving gangs, at or below SCALE_IN_FRACTION x (n - 1). (c) is there because
# a gang's KV cache can fill before max_num_seqs run (long prompts: K running, K below half
# of max_num_seqs): a load between K x (n - 1) and the slots' limit would otherwise cycle,
# n gangs serving it without a queue, the scale-in parking one, the others queueing, the
# scale-out waking it again, a stop/start billed and minutes of queueing every turn. A
# serving gang without a KV figure, as one without running or waiting figures, leaves the
# load unknown. max_num_seqs is what one gang's engine runs at once
# (components/engine_capacity.py, waker.json's gang_max_num_seqs); both figures are vLLM's
# gauges of its scheduler, set from its stats: len(self.running) and
# len(self.waiting) (vllm/v1/metrics/loggers.py, PrometheusStatLogger.record:
# gauge_scheduler_running.set(scheduler_stats.num_running_reqs),
# gauge_scheduler_waiting.set(scheduler_stats.num_waiting_reqs); vllm/v1/core/sched/
# scheduler.py make_stats), read per gang from Prometheus on the gateway.
#
# The hysteresis. Scale-out needs requests waiting on the serving gangs, more than 0 per
# gang at every look for SCALE_OUT_HOLD_SECONDS: their engines admit no more (a full batch
# of max_num_seqs or a full KV cache, above), a load above what n gangs run: n x
# max_num_seqs requests or n caches full, whichever binds first. Scale-in needs no queue and
# the load at or below half of what one gang fewer holds, by both measures: after it, the
# n - 1 gangs left use at most half their slots and half their KV caches and nothing waits,
# so the load must double against whichever limit binds (slots or KV), and hold for the
# scale-out's minute, before the waker starts a gang again. A fraction of 1 would leave the
# gangs full right after a scale-in, and the next request would queue: a wake,
# idleStopMinutes later a park, and so on, every wake minutes of latency and a stop/start
# billed. Half, not less: nginx's least_conn balances connections, not engine slots or
# cache, so one gang can carry more than its share for a while, and a KV cache's use grows
# as its requests generate, which a fraction leaves room for; less than half keeps a gang
# billed for a load one gang fewer runs without a queue.
#
# The window is idleStopMinutes (no constant of its own): the time the user chose after
# which a stop now and a wake at the next request are worth it, which is exactly what a
# scale-in trades (the next peak waits the hold and a wake: `plan` prints it). A look with
# a request waiting, a load above either limit, a look without figures (Prometheus down, a serving gang's engine
# not scraped), a gang that starts or stops serving, and a gang on its way up (a wake
# asked) all start the window again: no scale-in right after a scale-out until the new
# gang has served for the whole window. The last serving gang (replicas 0) keeps the idle
# rule instead: no client request at all for idleStopMinutes, since no gang would be left.
SCALE_IN_FRACTION = 0.5

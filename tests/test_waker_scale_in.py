"""The waker's scale-in (issue 36, point 2, design decisions 2-3; on the load, issue 48
point 3): a serving warm gang is parked (drained from the API pool, then its instances
stopped) when the load, requests running plus waiting over the serving gangs, fit on one gang
fewer (at most scale_in_fraction x (n - 1) x gang_max_num_seqs) at every look for
idle_stop_minutes; never an always-on gang, never below `replicas` serving gangs, never while
a gang wakes; the last serving gang only when it had no client request for
idle_stop_minutes; a drain that fails stops nothing; a parked gang woken again goes back
into the pool. The decision as pure logic, then the waker in process against the EC2 double
(tests/doubles/ec2_api.py), the Prometheus query double (tests/doubles/prometheus_api.py)
and a double of the gateway's pool commands, on a clock the test moves."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from components import metrics
from tests.doubles.prometheus_api import CLIENT_FINISHED_QUERY, KV_QUERY, RUNNING_QUERY, PrometheusQueryDouble
from tests.test_waker import (  # noqa: F401 - aws, head, gateway_host: the fixtures
    GANG0,
    GANG1,
    STACK_TAGS,
    Head,
    aws,
    config,
    eventually,
    gateway_host,
    head,
    waker,
)
from tests.test_waker_scale import Clock, scaling

POLL = waker.POLL_SECONDS
MINUTES = 10
IDLE = MINUTES * 60


def test_the_doubles_queries_are_the_ones_the_waker_asks():
    assert (waker.RUNNING_QUERY, waker.CLIENT_FINISHED_QUERY, waker.KV_QUERY) == (
        RUNNING_QUERY,
        CLIENT_FINISHED_QUERY,
        KV_QUERY,
    )


# --- the idle clock, pure ------------------------------------------------------------------------


def figures(running=0.0, waiting=0.0, finished=0.0):
    return waker.Activity(running=running, waiting=waiting, client_finished=finished)


def test_a_gangs_idle_time_counts_from_its_last_client_request_and_probes_do_not_count():
    clock = waker.IdleClock()
    serving = frozenset({"gang1"})
    clock.observe(0, serving, {"gang1": figures(finished=5)})
    assert clock.idle_seconds(0) == {"gang1": 0}
    # The stack's 1-token probes are left out of client_finished by the query: it stays.
    clock.observe(300, serving, {"gang1": figures(finished=5)})
    assert clock.idle_seconds(300) == {"gang1": 300}
    clock.observe(400, serving, {"gang1": figures(finished=6)})  # a client request finished
    assert clock.idle_seconds(500) == {"gang1": 100}
    clock.observe(600, serving, {"gang1": figures(running=1, finished=6)})  # one runs
    clock.observe(700, serving, {"gang1": figures(waiting=2, finished=6)})  # two wait
    assert clock.idle_seconds(700) == {"gang1": 0}
    # A restarted engine counts from zero again: activity, not a negative idleness.
    clock.observe(800, serving, {"gang1": figures(finished=0)})
    assert clock.idle_seconds(900) == {"gang1": 100}


def test_a_gang_without_figures_is_never_idle_and_a_gang_counts_from_when_it_serves():
    clock = waker.IdleClock()
    clock.observe(0, frozenset({"gang1"}), {})  # Prometheus did not reach its engine
    clock.observe(900, frozenset({"gang1"}), {})
    assert clock.idle_seconds(900) == {"gang1": 0}
    clock.observe(1000, frozenset(), {"gang1": figures()})  # stopped: forgotten
    clock.observe(2000, frozenset({"gang1"}), {"gang1": figures()})  # serves again
    assert clock.idle_seconds(2000) == {"gang1": 0}
    clock.forget()  # a look at Prometheus failed: nobody is known idle
    assert clock.idle_seconds(2500) == {}


# --- the decision, pure -------------------------------------------------------------------------

# What test_waker_scale's scaling() tells the waker: engines of two slots (as the fleet's),
# half of one gang fewer's slots.
CAPACITY, FRACTION = 2, 0.5
SERVING2 = {"gang0": "serving", "gang1": "serving"}
SERVING3 = {"gang0": "serving", "gang1": "serving", "gang2": "serving"}


def rule(replicas=1):
    return waker.ScaleInRule(replicas, CAPACITY, FRACTION, IDLE)


def watched(states, *loads, replicas=1, window=None, start=0.0):
    """A LoadWindow that saw `loads` (running, waiting[, KV cache summed, most waiting on a
    gang: by default none, and all the waiting on one gang]), or None for a look without
    figures, one look every POLL from `start` on the pool `states`; and the time of its
    last look."""
    window = window or waker.LoadWindow()
    at = start
    for index, load in enumerate(loads):
        at = start + index * POLL
        if load is not None and len(load) == 2:
            load = (*load, 0.0, load[1])
        window.observe(at, states, None if load is None else waker.Load(*load), rule(replicas))
    return window, at


def looks(load, seconds=IDLE):
    """The same load at every look for `seconds`, both ends included."""
    return [load] * (int(seconds // POLL) + 1)


def decide(states, window, now, replicas=1, idle=None, busy=False):
    roles = waker.gang_roles(list(states), replicas)
    return waker.scale_in_decision(states, roles, rule(replicas), window, now, idle or {}, busy)


def test_a_load_that_fits_on_one_gang_fewer_for_the_window_parks_the_last_serving_warm_gang():
    # Three serving, two slots each: one gang fewer runs 4, half of it is 2.
    window, now = watched(SERVING3, *looks((2, 0, 0.4, 0)))
    decision = decide(SERVING3, window, now)
    assert decision.gang == "gang2" and not decision.last
    assert decision.reason == (
        f"scaled in: the load (at most 2 running + 0 waiting, KV cache 0.4 of a gang's) fit on 2 gangs for "
        f"{MINUTES} min (limits 0.5 x 2 x 2 slots = 2, KV cache 0.5 x 2 = 1 gang's)"
    )
    # One look short of the window: not yet.
    window, now = watched(SERVING3, *looks((2, 0), IDLE - POLL))
    assert decide(SERVING3, window, now) is None


def test_the_limit_is_inclusive_and_one_request_more_at_any_look_starts_the_window_again():
    """Two serving gangs of two slots: the load may hold 1 request (0.5 x 1 x 2); 2 at one
    look, even a minute into the window, restarts it."""
    assert rule().limit(2) == 1 and rule().limit(3) == 2
    window, now = watched(SERVING2, *looks((1, 0)))
    assert decide(SERVING2, window, now).gang == "gang1"
    window, now = watched(SERVING2, (1, 0), (1, 0), (1, 0), (1, 0), (2, 0), *looks((1, 0), IDLE - POLL))
    assert decide(SERVING2, window, now) is None
    window, now = watched(SERVING2, (1, 0), window=window, start=now + POLL)
    decision = decide(SERVING2, window, now)
    assert decision.gang == "gang1" and "at most 1 running + 0 waiting" in decision.reason


def test_scale_out_and_scale_in_never_oscillate():
    """The hysteresis. Scale-out needs requests waiting on every serving gang (each engine
    admits no more: above n x 2 requests); scale-in needs at most 0.5 x (n - 1) x 2. The
    highest load that scales in leaves the gangs that stay half full, nothing waits, and the
    scale-out's window sees no queue; and the load that scaled out never fits on fewer."""
    window, now = watched(SERVING2, *looks((1, 0)))
    assert decide(SERVING2, window, now).gang == "gang1"
    after = {"gang0": "serving", "gang1": "stopped"}
    # The same request, now on gang0 alone: one of its two slots, none waiting.
    queue = [waker.QueueSample(at, {"gang0": 0.0}) for at in range(0, 120, POLL)]
    assert waker.scale_decision(after, queue, 105, 2, 0.0, 60) is None
    # The other way: a queue on gang0 alone (2 running, 1 waiting) for a minute wakes gang1.
    queue = [waker.QueueSample(at, {"gang0": 1.0}) for at in range(0, 75, POLL)]
    assert waker.scale_decision(after, queue, 60, 2, 0.0, 60).gang == "gang1"
    # Once gang1 serves, that load (3 requests) is above 1: no scale-in, however long.
    window, now = watched(SERVING2, *looks((2, 1), 3 * IDLE))
    assert decide(SERVING2, window, now) is None


def test_no_scale_in_right_after_a_scale_out_until_the_window_passed_with_the_new_gang():
    """The window belongs to the pool as it is: a gang waking, then serving, starts it
    again, so the load must fit for the whole window with the woken gang serving."""
    waking = {"gang0": "serving", "gang1": "serving", "gang2": "waking"}
    window, now = watched(SERVING2, *looks((0, 0)))
    window, now = watched(waking, *looks((0, 0)), window=window, start=now + POLL)
    assert decide(waking, window, now) is None  # capacity on its way: the load asked for more
    window, now = watched(SERVING3, *looks((0, 0), IDLE - POLL), window=window, start=now + POLL)
    assert decide(SERVING3, window, now) is None
    window, now = watched(SERVING3, (0, 0), window=window, start=now + POLL)
    assert decide(SERVING3, window, now).gang == "gang2"
    # The decision reads only a window of this pool: one observed for another is no window.
    assert decide(SERVING2, window, now) is None


def test_a_look_without_figures_starts_the_window_again():
    """Prometheus down (the waker's forget) or a serving gang's engine not scraped (no
    figures of it: pool_load None): the load then is unknown."""
    figures = {"gang0": waker.Activity(1, 0, 5, 0.25)}
    assert waker.pool_load(frozenset({"gang0", "gang1"}), figures) is None
    both = {**figures, "gang1": waker.Activity(0, 1, 7, 0.5), "gang9": waker.Activity(9, 9, 0, 1.0)}
    assert waker.pool_load(frozenset({"gang0", "gang1"}), both) == waker.Load(1, 1, 0.75, 1)
    # A serving gang without a KV figure (its engine's gauge not scraped): unknown too.
    without_kv = {**both, "gang1": waker.Activity(0, 1, 7)}
    assert waker.pool_load(frozenset({"gang0", "gang1"}), without_kv) is None
    window, now = watched(SERVING2, *looks((0, 0), IDLE / 2), None, *looks((0, 0), IDLE - POLL))
    assert decide(SERVING2, window, now) is None
    window.forget()
    window, now = watched(SERVING2, *looks((0, 0), IDLE - POLL), window=window, start=now + POLL)
    assert decide(SERVING2, window, now) is None


def test_a_kv_bound_load_that_two_gangs_serve_without_a_queue_is_not_scaled_in():
    """Issue 48's review: long prompts fill a gang's KV cache before its slots. Three gangs
    serve two such requests without a queue, each 0.9 of its gang's cache: within the
    slots' limit (0.5 x 2 x 2 = 2), but 1.8 gangs' worth of KV cache is above half of two
    gangs' (1.0), so the gangs left would soon queue, and the scale-out wake the parked one
    again (a stop/start billed, minutes of queueing, each cycle): no scale-in, however long.
    The same requests with short prompts (0.2 each) scale in."""
    window, now = watched(SERVING3, *looks((2, 0, 1.8, 0), 3 * IDLE))
    assert decide(SERVING3, window, now) is None
    window, now = watched(SERVING3, *looks((2, 0, 0.4, 0)))
    assert decide(SERVING3, window, now).gang == "gang2"
    # The limit is inclusive, as the slots' is: 1.0 gangs' worth on two gangs fewer fits.
    assert waker.ScaleInRule(1, CAPACITY, FRACTION, IDLE).fits(waker.Load(2, 0, 1.0, 0), 3)


def test_a_look_with_any_request_waiting_starts_the_window_again():
    """A request waiting on a serving gang is an engine that admits no more: the gangs left
    would queue too. One such look, even with the requests within the slots' limit, restarts
    the window; with every gang serving and each a queue, nothing is parked."""
    window, now = watched(SERVING3, *looks((1, 0), IDLE / 2), (1, 1), *looks((1, 0), IDLE - POLL), start=0)
    assert decide(SERVING3, window, now) is None
    window, now = watched(SERVING3, (1, 0), window=window, start=now + POLL)
    assert decide(SERVING3, window, now).gang == "gang2"
    # A queue on each of the three gangs: never parked.
    window, now = watched(SERVING3, *looks((0, 3, 0.3, 1), 3 * IDLE))
    assert decide(SERVING3, window, now) is None


def test_a_serving_gang_without_a_kv_figure_starts_the_window_again(two_serving, aws, prometheus):  # noqa: F811
    make, _ = two_serving
    woken = make()
    idle_out(woken, IDLE / 2)
    prometheus.kv = {"gang0": 0.0}  # gang1's KV gauge not scraped at this look
    look(woken)
    prometheus.kv = {"gang0": 0.0, "gang1": 0.0}
    idle_out(woken, IDLE - 2 * POLL)
    assert woken.pool_command.calls == [] and aws.stopped == []
    idle_out(woken, POLL)
    assert aws.stopped == GANG1


def test_an_always_on_gang_is_never_parked_and_never_fewer_than_replicas_serve():
    window, now = watched({"gang0": "serving", "gang1": "stopped"}, *looks((0, 0), 10 * IDLE))
    assert decide({"gang0": "serving", "gang1": "stopped"}, window, now, idle={"gang0": 10 * IDLE}) is None
    # replicas 2: gang0 is down, gang1 and gang2 serve: not parked.
    states = {"gang0": "stopped", "gang1": "serving", "gang2": "serving"}
    window, now = watched(states, *looks((0, 0)), replicas=2)
    assert decide(states, window, now, replicas=2) is None
    window, now = watched(SERVING3, *looks((0, 0)), replicas=2)
    assert decide(SERVING3, window, now, replicas=2).gang == "gang2"


def test_with_replicas_0_the_last_serving_gang_parks_only_when_it_had_no_client_request():
    """The last serving gang leaves no gang behind: the load rule does not apply (no gang
    fewer to fit on), only the idle rule: no client request for the window (IdleClock) and
    none running or waiting."""
    window, now = watched(SERVING2, *looks((0, 0)), replicas=0)
    assert decide(SERVING2, window, now, replicas=0).gang == "gang1"
    states = {"gang0": "serving", "gang1": "stopped"}
    window, now = watched(states, *looks((0, 0)), replicas=0)
    assert decide(states, window, now, replicas=0, idle={"gang0": IDLE - 1}) is None
    decision = decide(states, window, now, replicas=0, idle={"gang0": IDLE})
    assert decision.gang == "gang0" and decision.last
    assert decision.reason == f"scaled in: no client request for {MINUTES} min"
    assert decide(states, window, now, replicas=0, idle={"gang0": IDLE}, busy=True) is None
    assert decide({**states, "gang1": "waking"}, window, now, replicas=0, idle={"gang0": IDLE}) is None


def test_roles_follow_replicas_and_gang_order():
    assert waker.gang_roles(["gang0", "gang1", "gang2"], 1) == {"gang0": "always-on", "gang1": "warm", "gang2": "warm"}
    assert waker.gang_roles(["gang0", "gang1"], 0) == {"gang0": "warm", "gang1": "warm"}


# --- the waker, in process ----------------------------------------------------------------------


class GatewayPoolDouble:
    """vllm-cluster-gateway's drain and return as the waker runs them: each call recorded,
    answered with `fails` (subcommand -> exit status and output) or success."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.fails: dict[str, tuple[int, str]] = {}

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(list(argv))
        return self.fails.get(argv[0], (0, f"{argv[0]} {argv[2]}: done"))

    def of(self, subcommand: str) -> list[list[str]]:
        return [call for call in self.calls if call[0] == subcommand]


@pytest.fixture
def prometheus():
    double = PrometheusQueryDouble().start()
    yield double
    double.stop()


@pytest.fixture
def two_serving(tmp_path, aws, prometheus):  # noqa: F811 - the fixture
    """gang0 always-on and gang1 warm (replicas 1, maxReplicas 2), both serving, both idle."""
    heads = {"gang0": Head(), "gang1": Head()}
    for server in heads.values():
        server.start()
    for instance_id in GANG1:
        aws.tags[instance_id] = dict(STACK_TAGS)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "gangs").write_text("".join(f"{name} 127.0.0.1:{server.port}\n" for name, server in heads.items()))
    prometheus.running = {"gang0": 0, "gang1": 0}
    prometheus.waiting = {"gang0": 0, "gang1": 0}
    prometheus.client_finished = {"gang0": 3, "gang1": 7}
    prometheus.kv = {"gang0": 0.0, "gang1": 0.0}

    def make(**overrides):
        settings = config(
            endpoint=aws.endpoint,
            gangs={"gang0": GANG0, "gang1": GANG1},
            imds=aws.imds.url,
            ca_file=aws.ca,
            idle_stop_minutes=MINUTES,
            **scaling(prometheus=prometheus.url, **overrides),
        )
        woken = waker.Waker(waker.parse_config(json.dumps(settings)), str(state_dir), aws.client())
        woken.clock = Clock()
        woken.pool_command = GatewayPoolDouble()
        woken.poll()
        return woken

    yield make, heads
    for server in heads.values():
        server.stop()


def look(woken, seconds: float = POLL):
    """One round of the poller; a scale-in's park, on its own thread, followed to its end."""
    woken.clock.now += seconds
    woken.poll()
    woken.scale()
    if woken.scale_in_park is not None:
        woken.scale_in_park.join(10)
        assert not woken.scale_in_park.is_alive()
    woken.return_parked()


def idle_out(woken, seconds: float = IDLE):
    for _ in range(int(seconds // POLL) + 1):
        look(woken)


# What power.json says of a warm gang parked after a window without any request.
IDLE_WHY = (
    f"scaled in: the load (at most 0 running + 0 waiting, KV cache 0 of a gang's) fit on 1 gang for {MINUTES} min "
    "(limits 0.5 x 1 x 2 slots = 1, KV cache 0.5 x 1 = 0.5 gang's)"
)


def test_an_idle_warm_gang_is_drained_then_stopped_and_the_always_on_gang_keeps_serving(two_serving, aws):  # noqa: F811 - the fixture
    make, _ = two_serving
    woken = make()
    look(woken, 0)
    for _ in range(int(IDLE // POLL) - 1):
        look(woken)
    assert woken.pool_command.calls == [] and aws.stopped == []
    idle_out(woken, 2 * POLL)
    drains = woken.pool_command.of("drain")
    wait = str(waker.PARK_WAIT_SECONDS)
    assert drains == [["drain", "--gang", "gang1", "--timeout", "600", "--wait", wait, "--park"]]
    assert aws.stopped == GANG1
    record = woken.power["gang1"]
    assert record["state"] in ("stopping", "stopped") and record["parked"]
    assert record["role"] == "warm" and woken.power["gang0"]["role"] == "always-on"
    assert record["why"] == IDLE_WHY and record["why_at"]
    # Much later, still idle: gang0 always serves.
    idle_out(woken, 3 * IDLE)
    assert aws.stopped == GANG1 and len(woken.pool_command.of("drain")) == 1
    assert json.loads(Path(woken.power_file).read_text())["gangs"]["gang1"]["why"].startswith("scaled in")


def test_a_trickle_below_one_gangs_capacity_scales_a_warm_gang_in_within_the_window(two_serving, aws, prometheus):  # noqa: F811
    """Issue 48: one client's requests, one at a time, spread by the pool over both gangs and
    never idle: before, the warm gang stayed up as long as they came; now the load (1
    request, half of gang0's two slots) fits on gang0, and gang1 is parked after the window
    with the request it runs drained, not cut."""
    make, _ = two_serving
    woken = make()
    on = ({"gang0": 1, "gang1": 0}, {"gang0": 0, "gang1": 1})
    for step in range(int(IDLE // POLL)):
        prometheus.running = on[step % 2]
        prometheus.client_finished = {"gang0": 3 + step, "gang1": 7 + step}
        look(woken)
    assert woken.pool_command.calls == [] and aws.stopped == []
    look(woken)
    assert [call[:3] for call in woken.pool_command.of("drain")] == [["drain", "--gang", "gang1"]]
    assert aws.stopped == GANG1
    assert woken.power["gang1"]["why"] == (
        f"scaled in: the load (at most 1 running + 0 waiting, KV cache 0 of a gang's) fit on 1 gang for {MINUTES} "
        "min (limits 0.5 x 1 x 2 slots = 1, KV cache 0.5 x 1 = 0.5 gang's)"
    )


def test_a_load_above_the_limit_keeps_a_warm_gang_serving(two_serving, aws, prometheus):  # noqa: F811
    """Two requests at every look, one on each gang: on gang0 alone they would fill both its
    slots, above half of them: both gangs serve on."""
    make, _ = two_serving
    woken = make()
    prometheus.running = {"gang0": 1, "gang1": 1}
    idle_out(woken, 3 * IDLE)
    assert woken.pool_command.calls == [] and aws.stopped == []
    # The load falls to one request: the window starts then, and gang1 parks a window later.
    prometheus.running = {"gang0": 1, "gang1": 0}
    idle_out(woken, IDLE - POLL)
    assert aws.stopped == []
    look(woken)
    assert aws.stopped == GANG1


def test_a_look_at_prometheus_that_fails_or_lacks_a_gang_starts_the_window_again(two_serving, aws, prometheus):  # noqa: F811
    make, _ = two_serving
    woken = make()
    idle_out(woken, IDLE / 2)
    prometheus.down = True
    look(woken)
    prometheus.down = False
    idle_out(woken, IDLE / 2)
    prometheus.running = {"gang0": 0}  # gang1's engine not scraped at this look
    look(woken)
    prometheus.running = {"gang0": 0, "gang1": 0}
    idle_out(woken, IDLE - 2 * POLL)
    assert woken.pool_command.calls == [] and aws.stopped == []
    idle_out(woken, POLL)
    assert aws.stopped == GANG1


def test_a_scale_in_drains_on_its_own_thread_and_the_poller_looks_on(two_serving, aws, prometheus):  # noqa: F811
    """The drain waits up to the API's read timeout for the parked gang's requests: on the
    poller's thread it stopped every look (wakes not followed, no scale-out) that long.
    Here the drain blocks until the test lets it: the poller's looks go on meanwhile, gang1
    counts as not serving (stopping) for them, a second park of it is refused, and a queue
    on gang0 alone is read against gang0 alone."""
    make, _ = two_serving
    woken = make()
    release, draining = threading.Event(), threading.Event()
    double = woken.pool_command

    def blocked(argv):
        if argv[0] == "drain":
            draining.set()
            release.wait(10)
        return double(argv)

    woken.pool_command = blocked
    idle_out_start = woken.clock.now
    for _ in range(int(IDLE // POLL) + 1):
        woken.clock.now += POLL
        woken.poll()
        if woken.scale() is not None:
            break
    assert woken.clock.now - idle_out_start <= IDLE + POLL and draining.wait(5)
    try:
        assert woken.power["gang1"]["parking"] and woken.scale_states()["gang1"] == "stopping"
        # The poller's next looks run while the drain waits.
        prometheus.waiting = {"gang0": 3, "gang1": 0}
        for _ in range(3):
            woken.clock.now += POLL
            woken.poll()
            assert woken.scale() is None
            woken.return_parked()
        assert woken.queue.samples[-1].waiting["gang0"] == 3
        assert woken.park("gang1", "again") == ("left", "a park of it goes on")
        assert aws.stopped == []
    finally:
        release.set()
    woken.scale_in_park.join(10)
    assert aws.stopped == GANG1 and woken.power["gang1"]["why"].startswith("scaled in: the load")
    assert "parking" not in woken.power["gang1"]


def test_a_drain_that_fails_stops_nothing_and_says_so(two_serving, aws):  # noqa: F811 - the fixture
    make, _ = two_serving
    woken = make()
    woken.pool_command.fails["drain"] = (1, "drain gang1: gave up after 60 s (gang1 stays in the pool)")
    idle_out(woken, IDLE + POLL)
    assert woken.pool_command.of("drain") and aws.stopped == []
    record = woken.power["gang1"]
    assert record["state"] == "serving" and not record.get("parked")
    assert "drain failed, not stopped" in record["park_error"]["why"] and "gave up" in record["park_error"]["why"]


def test_a_parked_gang_woken_again_returns_to_the_pool_once_it_serves(two_serving, aws):  # noqa: F811 - the fixture
    make, heads = two_serving
    woken = make()
    idle_out(woken, IDLE + 2 * POLL)
    assert aws.stopped == GANG1
    look(woken)
    assert woken.power["gang1"]["state"] == "stopped"
    heads["gang1"].stop()
    woken.wake("asked on this host (vllm-cluster-gateway wake)", by_hand=True)
    assert woken.power["gang1"]["why"] == "woken: asked on this host (vllm-cluster-gateway wake)"
    for instance_id in GANG1:
        aws.states[instance_id] = "running"
    look(woken)
    assert woken.power["gang1"]["state"] == "waking" and woken.pool_command.of("return") == []
    heads["gang1"].start()
    look(woken)
    assert woken.pool_command.of("return") == [["return", "--gang", "gang1"]]
    assert woken.power["gang1"]["state"] == "serving" and not woken.power["gang1"].get("parked")


def test_no_node_report_parks_an_always_on_gang_or_stops_another_stacks_instance(two_serving, aws, prometheus):  # noqa: F811
    """A node writes its own /metrics: values that say "idle" for every gang, series that
    claim a gang label of their own (another gang's, or a name the stack does not have).
    Prometheus on the gateway relabels a node's series with its target's gang, but even a
    series that got through names no instance: the waker parks only warm gangs of its
    waker.json and stops only their instances, of the stack's tag."""
    make, _ = two_serving
    other = "i-0c000000000000001"  # another stack's instance, running in the same account
    aws.states[other] = "running"
    aws.tags[other] = {**STACK_TAGS, "vllm-cluster:stack": "prod"}
    prometheus.extra = {
        RUNNING_QUERY: [({"gang": "gang0", "exported_gang": "gang9"}, 0), ({"gang": "prod-gang0"}, 0)],
        CLIENT_FINISHED_QUERY: [({"gang": other}, 0), ({"gang": "gang0", "node": "evil"}, 0)],
    }
    woken = make()
    idle_out(woken, 4 * IDLE)
    parked = {call[2] for call in woken.pool_command.of("drain")}
    assert parked == {"gang1"} and sorted(aws.stopped) == sorted(GANG1)
    assert aws.states[other] == "running" and all(aws.states[i] == "running" for i in GANG0)


def test_the_waker_unit_lets_drain_and_return_write_what_they_write_and_nothing_more():
    """ProtectSystem=strict makes the whole file system read-only for the waker and what it
    runs: the pool's state and lock, nginx's include (written through a temporary file
    beside it), nginx's logs and its pid file (`nginx -t` opens both for writing; on the
    fleet's gateway the pid file's refusal, "open() "/run/nginx.pid" failed (30: Read-only
    file system)", failed every park's drain) must be writable for a park."""
    root = Path(waker.__file__).resolve().parent
    unit = (root / "units" / "vllm-cluster-waker.service").read_text()
    gateway = (root / "vllm-cluster-gateway").read_text()
    writable = next(line for line in unit.splitlines() if line.startswith("ReadWritePaths="))
    paths = writable.split("=", 1)[1].split()
    assert "readonly UPSTREAM_INCLUDE=/etc/nginx/vllm-cluster-upstream.inc" in gateway
    assert "readonly POOL_DIR=$STATE_DIR/gateway" in gateway
    assert paths == ["/var/lib/vllm-cluster/gateway", "/etc/nginx", "/var/log/nginx", "-/run/nginx.pid"]
    assert "ProtectSystem=strict" in unit


# --- the park after a deploy (vllm-cluster-gateway park) ----------------------------------------


def serve_http(woken):
    """The waker's HTTP server on loopback, as `serve` runs it."""
    server = waker.ThreadingHTTPServer(("127.0.0.1", 0), waker.make_handler(woken))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def post(port: int, path: str, headers: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=b"", headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_park_parks_every_idle_warm_gang_at_once_and_only_for_this_hosts_root(two_serving, aws, tmp_path, capsys):  # noqa: F811
    make, _ = two_serving
    woken = make()
    woken.figures_wait_seconds = 0
    server = serve_http(woken)
    try:
        port = server.server_address[1]
        # Through nginx (X-Forwarded-For) /park is just another request no gang could take.
        status, answer = post(port, "/park", {"X-Forwarded-For": "203.0.113.9"})
        assert status == 502 and woken.pool_command.calls == [] and aws.stopped == []
        settings = tmp_path / "waker.json"
        settings.write_text(json.dumps(woken.config))
        code = waker.main(["--config", str(settings), "--state-dir", woken.state_dir, "park", "--port", str(port)])
    finally:
        server.shutdown()
        server.server_close()
    printed = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "parked gang1: parked after deploy" in printed
    assert "left gang0: always-on: it always serves" in printed
    assert aws.stopped == GANG1 and woken.power["gang1"]["why"] == "parked after deploy"


def test_park_drains_a_warm_gang_with_requests_while_another_gang_serves(two_serving, aws, prometheus):  # noqa: F811
    """Issue 48: the park after an up used to leave a warm gang with a request running to the
    idle rule (and a fleet test, whose own client had a request on gang1, raced on it). The
    drain is what makes it safe: out of the pool (new requests go to gang0), its requests
    finish on it (the drain waits up to the API's read timeout), then it stops."""
    make, _ = two_serving
    woken = make()
    woken.figures_wait_seconds = 0
    # One client's request, on gang1 (the fleet's trickle): it fits on gang0 (0.5 x 1 x 2 = 1).
    prometheus.running, prometheus.waiting = {"gang0": 0, "gang1": 1}, {"gang0": 0, "gang1": 0}
    outcome = woken.park_idle()
    assert outcome["failed"] == {} and outcome["left"] == {"gang0": "always-on: it always serves"}
    assert outcome["parked"]["gang1"] == (
        "parked after deploy (drained first: 1 requests running, 0 waiting finished on it, "
        "new ones went to the other gangs)"
    )
    wait = str(waker.PARK_WAIT_SECONDS)
    assert woken.pool_command.of("drain") == [
        ["drain", "--gang", "gang1", "--timeout", "600", "--wait", wait, "--park"]
    ]
    assert aws.stopped == GANG1 and woken.power["gang1"]["why"] == waker.PARKED_AFTER_DEPLOY


def test_park_leaves_a_warm_gang_the_load_needs(two_serving, aws, prometheus):  # noqa: F811
    """Issue 48's review: an up starts every gang, and the park after it drained every warm
    gang whatever the load, at a peak too. Now a warm gang is parked only if the load fits
    on one gang fewer at that look (the scale-in's test, no window); else it is left, and
    the scale-in parks it later. A queue, too many requests, a full KV cache or unknown
    figures each leave it."""
    make, _ = two_serving
    woken = make()
    woken.figures_wait_seconds = 0
    later = "the scale-in parks it once the load fits on one gang fewer for idleStopMinutes"
    for running, waiting, kv in (({"gang0": 2, "gang1": 2}, {}, {}), ({}, {"gang0": 1}, {}), ({}, {}, {"gang1": 0.8})):
        prometheus.running = {"gang0": 0, "gang1": 0, **running}
        prometheus.waiting = {"gang0": 0, "gang1": 0, **waiting}
        prometheus.kv = {"gang0": 0.0, "gang1": 0.0, **kv}
        outcome = woken.park_idle()
        assert outcome["parked"] == {} and outcome["left"]["gang1"].startswith("the load needs it: "), outcome
        assert outcome["left"]["gang1"].endswith(later)
        if running:
            assert outcome["left"]["gang1"] == (
                "the load needs it: 4 running + 0 waiting (at most 0 on a gang), KV cache 0 of a gang's, on 2 "
                f"gangs; limits 1 requests, no queue, KV cache 0.5 gang's; {later}"
            )
    prometheus.kv = {"gang0": 0.0}  # gang1's KV gauge not scraped yet
    outcome = woken.park_idle()
    assert outcome["left"]["gang1"].startswith("the load needs it: its figures are unknown")
    assert woken.pool_command.calls == [] and aws.stopped == []
    # The load falls: the next park parks it.
    prometheus.kv = {"gang0": 0.0, "gang1": 0.0}
    outcome = woken.park_idle()
    assert outcome["parked"] == {"gang1": "parked after deploy"} and aws.stopped == GANG1


def test_park_counts_a_gang_the_poller_parks_as_not_serving(two_serving, aws, prometheus):  # noqa: F811
    make, _ = two_serving
    woken = make()
    woken.figures_wait_seconds = 0
    woken.power["gang1"]["parking"] = {"at": "2026-01-01T00:00:00Z", "reason": "scaled in: the load ..."}
    outcome = woken.park_idle()
    assert outcome["left"] == {"gang1": "stopping: not serving", "gang0": "always-on: it always serves"}
    assert woken.pool_command.calls == []


def test_park_leaves_the_last_serving_gang_while_requests_run_on_it(two_serving, aws, prometheus):  # noqa: F811
    """replicas 0: gang1 is parked (the load fits on gang0), then gang0 is the last serving gang,
    and a request on it would find no other gang: it is left to the idle rule; idle, it
    is parked with --last."""
    make, _ = two_serving
    woken = make(replicas=0)
    woken.figures_wait_seconds = 0
    prometheus.running = {"gang0": 1, "gang1": 0}
    outcome = woken.park_idle()
    assert list(outcome["parked"]) == ["gang1"] and outcome["failed"] == {}
    assert outcome["left"]["gang0"] == (
        "the last serving gang, 1 requests running, 0 waiting now: no other gang would take them; "
        "the idle rule parks it later"
    )
    assert [call[2] for call in woken.pool_command.of("drain")] == ["gang1"] and aws.stopped == GANG1
    prometheus.running = {"gang0": 0, "gang1": 0}
    outcome = woken.park_idle()
    assert outcome["parked"] == {"gang0": "parked after deploy"}
    assert woken.pool_command.of("drain")[-1][-2:] == ["--park", "--last"]
    assert sorted(aws.stopped) == sorted(GANG0 + GANG1)


def test_park_reports_a_drain_that_failed_as_a_failure(two_serving, aws, tmp_path, capsys):  # noqa: F811
    make, _ = two_serving
    woken = make()
    woken.figures_wait_seconds = 0
    woken.pool_command.fails["drain"] = (1, "drain gang1: gave up after 60 s")
    server = serve_http(woken)
    try:
        settings = tmp_path / "waker.json"
        settings.write_text(json.dumps(woken.config))
        port = str(server.server_address[1])
        code = waker.main(["--config", str(settings), "--state-dir", woken.state_dir, "park", "--port", port])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and aws.stopped == []
    assert "failed gang1: drain failed, not stopped: drain gang1: gave up after 60 s" in capsys.readouterr().out


# --- the first request when nothing serves (decision 4) -----------------------------------------


def all_stopped(make, heads, aws, **overrides):  # noqa: F811 - the fixture's name
    for server in heads.values():
        server.stop()
    for instance_id in [*GANG0, *GANG1]:
        aws.states[instance_id] = "stopped"
    woken = make(**overrides)
    assert woken.states() == {"gang0": "stopped", "gang1": "stopped"}
    return woken


def test_with_replicas_0_a_request_wakes_one_gang_not_all(two_serving, aws):  # noqa: F811
    make, heads = two_serving
    woken = all_stopped(make, heads, aws, replicas=0)
    status, headers, body = woken.fallback(502)
    assert status == 503 and headers["Retry-After"] == "30"
    assert sorted(aws.started) == sorted(GANG0)
    assert "starting: gang0," in json.loads(body)["error"]["message"]
    assert woken.power["gang0"]["why"] == "woken: a request no gang could take"
    # gang0 on its way is capacity: the next requests start nothing more.
    for _ in range(3):
        assert woken.fallback(502)[0] == 503
    assert sorted(aws.started) == sorted(GANG0) and "wake" not in (woken.power["gang1"].get("why") or "")


def test_with_replicas_0_a_gang_held_off_by_a_wake_given_up_is_passed_over(two_serving, aws):  # noqa: F811
    make, heads = two_serving
    woken = all_stopped(make, heads, aws, replicas=0)
    woken.power["gang0"]["failed"] = {"retry_at": "2999-01-01T00:00:00Z", "reason": "it never served", "at": "x"}
    assert woken.fallback(502)[0] == 503
    assert aws.started == GANG1


def test_with_replicas_1_a_request_wakes_the_always_on_gang_not_the_warm_ones(two_serving, aws):  # noqa: F811
    make, heads = two_serving
    woken = all_stopped(make, heads, aws)
    status, _, body = woken.fallback(502)
    assert status == 503 and sorted(aws.started) == sorted(GANG0)
    assert "gang1" not in json.loads(body)["error"]["message"]


# --- power.json and `power`: each gang's role and why (decision 5) --------------------------------


def test_power_prints_each_gangs_role_and_why_after_its_first_three_columns(two_serving, aws, tmp_path, capsys):  # noqa: F811
    make, _ = two_serving
    woken = make()
    idle_out(woken, IDLE + 2 * POLL)
    assert aws.stopped == GANG1
    settings = tmp_path / "waker.json"
    settings.write_text(json.dumps(woken.config))
    assert waker.main(["--config", str(settings), "--state-dir", woken.state_dir, "power"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gang0, gang1 = (line.split() for line in lines)
    assert gang0[:2] == ["gang0", "serving"] and gang0[3:] == ["always-on"]
    assert gang1[:2] == ["gang1", "stopped"] and gang1[2].endswith("Z") and gang1[3] == "warm"
    why_at = woken.power["gang1"]["why_at"]
    assert lines[1].endswith(f" warm why: {IDLE_WHY} (at {why_at})")
    assert waker.main(["--config", str(settings), "--state-dir", woken.state_dir, "power", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["gangs"]
    assert records["gang1"]["role"] == "warm" and records["gang1"]["why"].startswith("scaled in")
    assert records["gang0"]["role"] == "always-on"


def test_a_wake_given_up_is_the_why_of_the_gang(two_serving, aws):  # noqa: F811
    make, heads = two_serving
    woken = all_stopped(make, heads, aws, give_up_seconds=1)
    woken.fallback(502)
    woken.power["gang0"]["wake"]["give_up_at"] = "2000-01-01T00:00:00Z"
    woken.poll()
    assert woken.power["gang0"]["why"].startswith("wake given up: it did not serve within 1 s")


# --- the pool's size to Prometheus (decision 6) ---------------------------------------------------


def test_the_exposition_counts_the_pools_gangs_by_state_and_its_bounds(two_serving, aws):  # noqa: F811
    make, _ = two_serving
    woken = make(replicas=0)
    idle_out(woken, IDLE + 2 * POLL)  # gang1 parked; gang0, the last, parks too (nothing runs)
    lines = waker.exposition(woken.states(), woken.power, woken.pool_bounds()).decode().splitlines()
    assert 'vllm_cluster_pool_gangs{state="serving"} 0' in lines
    assert 'vllm_cluster_pool_gangs{state="stopped"} 2' in lines
    assert (
        'vllm_cluster_pool_gangs{state="waking"} 0' in lines and 'vllm_cluster_pool_gangs{state="stopping"} 0' in lines
    )
    assert "vllm_cluster_pool_max_gangs 2" in lines and "vllm_cluster_pool_replicas 0" in lines
    wait = str(waker.PARK_WAIT_SECONDS)
    assert woken.pool_command.of("drain") == [
        ["drain", "--gang", "gang1", "--timeout", "600", "--wait", wait, "--park"],
        ["drain", "--gang", "gang0", "--timeout", "600", "--wait", wait, "--park", "--last"],
    ]
    # Without warm gangs: none of them.
    assert "vllm_cluster_pool" not in waker.exposition(woken.states(), woken.power).decode()
    # The names the alert rule reads (components/metrics.py).
    named = (waker.POOL_GANGS_METRIC, waker.POOL_MAX_METRIC, waker.POOL_REPLICAS_METRIC)
    assert named == (metrics.POOL_GANGS, metrics.POOL_MAX_GANGS, metrics.POOL_REPLICAS)


def test_the_exposition_says_how_long_the_load_has_fit_on_one_gang_fewer(two_serving, prometheus):  # noqa: F811
    make, _ = two_serving
    woken = make()
    look(woken, 0)
    look(woken)
    look(woken)

    def gauges():
        text = waker.exposition(woken.states(), woken.power, woken.pool_bounds(), woken.scale_in_window()).decode()
        return {line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith("vllm_cluster_scale")}

    assert gauges() == {"vllm_cluster_scale_in_fit_seconds": "30", "vllm_cluster_scale_in_window_seconds": "600"}
    prometheus.running = {"gang0": 2, "gang1": 0}  # above 0.5 x 1 x 2: the window starts again
    look(woken)
    assert gauges()["vllm_cluster_scale_in_fit_seconds"] == "0"
    # Without warm gangs: none of them.
    assert "vllm_cluster_scale_in" not in waker.exposition(woken.states(), woken.power).decode()


def test_the_gateways_park_asks_the_running_waker_and_needs_one(aws, head, gateway_host):  # noqa: F811
    """`sudo vllm-cluster-gateway park`, as the stack's last command runs it: through the
    waker's port in waker.env to the running waker; without a waker it says so and fails."""
    refused = gateway_host.run("park")
    assert refused.returncode == 1 and "this stack has no idle stop" in refused.stderr
    gateway_host.install_waker()
    document = json.dumps(config(endpoint=aws.endpoint, imds=aws.imds.url, ca_file=aws.ca))
    assert gateway_host.run("waker-config", stdin=document).returncode == 0
    eventually(lambda: gateway_host.run("power").stdout.startswith("gang0 serving"), what="the waker up")
    parked = gateway_host.run("park")
    assert parked.returncode == 0, parked.stderr
    assert parked.stdout == "left gang0: no warm gangs: maxReplicas is replicas\n"

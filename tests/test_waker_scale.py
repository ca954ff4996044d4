"""The waker's scale-out on the queue (issue 36, point 2): with maxReplicas above replicas,
one more stopped (warm) gang is started when requests waiting per serving gang stay above
the threshold for the hold time, never on a short burst, never while a gang is already
waking, never beyond maxReplicas. The decision as pure logic, then the waker itself in
process against the EC2 double (tests/doubles/ec2_api.py) and the Prometheus query double
(tests/doubles/prometheus_api.py), on a clock the test moves."""

from __future__ import annotations

import json

import pytest

from tests.doubles.prometheus_api import CLIENT_FINISHED_QUERY, RUNNING_QUERY, WAITING_QUERY, PrometheusQueryDouble
from tests.test_waker import GANG0, GANG1, STACK_TAGS, Head, aws, config, starts, waker  # noqa: F401 - aws: the fixture

HOLD = 60
POLL = waker.POLL_SECONDS


def test_the_doubles_query_is_the_one_the_waker_asks():
    assert waker.WAITING_QUERY == WAITING_QUERY


# --- the decision, pure ----------------------------------------------------------------------


def samples(*values: float, every: float = POLL, gang: str = "gang0") -> list:
    """One sample every `every` s from t=0, gang's requests waiting as given."""
    return [waker.QueueSample(index * every, {gang: value}) for index, value in enumerate(values)]


SERVING_AND_WARM = {"gang0": "serving", "gang1": "stopped"}


def decide(states=None, queue=(), now=None, most=2, threshold=0.0, hold=HOLD, held=frozenset()):
    queue = list(queue)
    now = queue[-1].at if now is None and queue else now or 0.0
    return waker.scale_decision(states or SERVING_AND_WARM, queue, now, most, threshold, hold, held)


def test_a_queue_that_stays_for_the_hold_time_starts_the_first_stopped_gang():
    decision = decide(queue=samples(3, 2, 4, 1, 5))  # t = 0 ... 60
    assert decision is not None and decision.gang == "gang1"
    assert "above 0 for 60 s" in decision.reason and "at least 1" in decision.reason


def test_a_burst_shorter_than_the_hold_time_starts_nothing():
    assert decide(queue=samples(3, 2, 4, 1)) is None  # 45 s of samples: not yet the hold time
    assert decide(queue=samples(0, 0, 4, 9, 9)) is None  # queued from t=30 only
    # One look with an empty queue inside the window: the engine kept up then.
    assert decide(queue=samples(3, 2, 0, 1, 5)) is None


def test_the_threshold_is_per_serving_gang_and_must_be_exceeded():
    states = {"gang0": "serving", "gang1": "serving", "gang2": "stopped"}
    two = [waker.QueueSample(i * POLL, {"gang0": 3, "gang1": 1}) for i in range(5)]  # 2 per gang
    assert decide(states, two, most=3, threshold=1.5).gang == "gang2"
    assert decide(states, two, most=3, threshold=2) is None
    # A gang that serves no engine Prometheus reached counts as an empty queue of its own.
    one = [waker.QueueSample(i * POLL, {"gang0": 3}) for i in range(5)]
    assert decide(states, one, most=3, threshold=1.5) is None


def test_a_waking_gang_is_capacity_on_its_way_and_nothing_more_starts():
    states = {"gang0": "serving", "gang1": "waking", "gang2": "stopped"}
    assert decide(states, samples(9, 9, 9, 9, 9), most=3) is None


def test_nothing_starts_beyond_max_replicas():
    states = {"gang0": "serving", "gang1": "serving", "gang2": "stopped"}
    queue = [waker.QueueSample(i * POLL, {"gang0": 9, "gang1": 9}) for i in range(5)]
    assert decide(states, queue, most=2) is None
    assert decide(states, queue, most=3).gang == "gang2"


def test_without_a_serving_gang_the_scaler_waits_for_the_first_request():
    """replicas 0: every gang asleep, no engine to read a queue from; the request that no
    gang could take wakes one (the fallback), not the scaler."""
    assert decide({"gang0": "stopped", "gang1": "stopped"}, samples(9, 9, 9, 9, 9)) is None


def test_a_gang_held_off_after_a_wake_given_up_is_passed_over():
    states = {"gang0": "serving", "gang1": "stopped", "gang2": "stopped"}
    assert decide(states, samples(9, 9, 9, 9, 9), most=3, held=frozenset({"gang1"})).gang == "gang2"
    assert decide(states, samples(9, 9, 9, 9, 9), most=3, held=frozenset({"gang1", "gang2"})) is None


def test_the_window_starts_again_when_the_serving_gangs_change_and_when_a_look_fails():
    window = waker.QueueWindow(keep_seconds=HOLD + 2 * POLL)
    for at in (0, 15, 30):
        window.observe(waker.QueueSample(at, {"gang0": 5}), frozenset({"gang0"}))
    assert len(window.samples) == 3
    window.observe(waker.QueueSample(45, {"gang0": 5}), frozenset({"gang0", "gang1"}))
    assert [s.at for s in window.samples] == [45]
    window.forget()
    assert window.samples == []
    for at in range(60, 400, 15):
        window.observe(waker.QueueSample(at, {"gang0": 5}), frozenset({"gang0", "gang1"}))
    assert window.samples[0].at >= 390 - HOLD - 2 * POLL  # old samples do not pile up


def test_prometheus_answers_are_read_and_anything_else_refused():
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    vector["data"]["result"] = [{"metric": {"gang": "gang0"}, "value": [1.0, "4"]}, {"metric": {}, "value": [1, "9"]}]
    assert waker.parse_waiting(vector) == {"gang0": 4.0}
    with pytest.raises(ValueError, match="error"):
        waker.parse_waiting({"status": "error", "error": "bad_data"})
    with pytest.raises(ValueError, match="matrix"):
        waker.parse_waiting({"status": "success", "data": {"resultType": "matrix", "result": []}})


# --- waker.json -------------------------------------------------------------------------------


def scaling(**overrides) -> dict:
    return {
        "replicas": 1,
        "max_replicas": 2,
        "scale_out_waiting_per_gang": 0,
        "scale_out_hold_seconds": HOLD,
        "scale_in_fraction": 0.5,
        "gang_max_num_seqs": 2,
        "prometheus": "http://127.0.0.1:9090/prometheus",
        "drain_timeout_seconds": 600,
        **overrides,
    }


def test_scaling_settings_are_all_or_none_and_checked():
    gangs = {"gang0": GANG0, "gang1": GANG1}
    assert waker.scales(waker.parse_config(json.dumps(config(gangs=gangs, **scaling()))))
    assert not waker.scales(waker.parse_config(json.dumps(config(gangs=gangs))))
    refused = [
        ({"max_replicas": 2}, "without"),
        (scaling(max_replicas=1), "max_replicas must be above replicas (1)"),
        (scaling(replicas=0, max_replicas=3), "gangs names 2"),
        (scaling(replicas=-1), "replicas must be at least 0"),
        (scaling(scale_out_hold_seconds=0), "scale_out_hold_seconds must be at least 1"),
        (scaling(scale_out_waiting_per_gang="1"), "scale_out_waiting_per_gang is not a number"),
        (scaling(scale_in_fraction=0), "scale_in_fraction must be above 0 and at most 1"),
        (scaling(scale_in_fraction=1.5), "scale_in_fraction must be above 0 and at most 1"),
        (scaling(gang_max_num_seqs=0), "gang_max_num_seqs must be at least 1"),
        (scaling(gang_max_num_seqs=2.5), "gang_max_num_seqs is not a int"),
        (scaling(prometheus="https://elsewhere"), "prometheus is not an http:// URL"),
    ]
    for settings, message in refused:
        with pytest.raises(waker.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            waker.parse_config(json.dumps(config(gangs=gangs, **settings)))


# --- the waker, in process, against the EC2 and Prometheus doubles -------------------------------


@pytest.fixture
def prometheus():
    double = PrometheusQueryDouble().start()
    yield double
    double.stop()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def warm_pool(tmp_path, aws, prometheus):  # noqa: F811 - the fixture
    """gang0 serves (its instances run, its head answers /health); gang1 is a warm gang,
    stopped, of the stack's own tags (test_waker's gang1 carries another project's)."""
    heads = {"gang0": Head(), "gang1": Head()}
    heads["gang0"].start()
    for instance_id in GANG1:
        aws.tags[instance_id] = dict(STACK_TAGS)
        aws.states[instance_id] = "stopped"
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "gangs").write_text("".join(f"{name} 127.0.0.1:{head.port}\n" for name, head in heads.items()))
    settings = config(
        endpoint=aws.endpoint,
        gangs={"gang0": GANG0, "gang1": GANG1},
        imds=aws.imds.url,
        ca_file=aws.ca,
        **scaling(prometheus=prometheus.url),
    )
    woken = waker.Waker(waker.parse_config(json.dumps(settings)), str(state_dir), aws.client())
    woken.clock = Clock()
    woken.poll()
    assert woken.states() == {"gang0": "serving", "gang1": "stopped"}
    yield woken, heads
    for head in heads.values():
        head.stop()


def look(woken, seconds: float = POLL):
    """One round of the poller, `seconds` after the last: a look at EC2 and the heads, then
    at the queue."""
    woken.clock.now += seconds
    woken.poll()
    return woken.scale()


def test_a_sustained_queue_starts_exactly_one_warm_gang(warm_pool, aws, prometheus):  # noqa: F811
    woken, heads = warm_pool
    prometheus.waiting = {"gang0": 6}
    decisions = [woken.scale()] + [look(woken) for _ in range(3)]  # t = 0, 15, 30, 45
    assert decisions == [None] * 4 and starts(aws) == []
    decision = look(woken)  # t = 60: queued at every look of the last minute
    assert decision is not None and decision.gang == "gang1"
    assert aws.started == GANG1
    assert woken.power["gang1"]["state"] == "waking"
    assert woken.power["gang1"]["wake"]["reason"].startswith("scale out: requests waiting per serving gang")
    # The queue stays while gang1 boots: it is capacity on its way, nothing more starts.
    for _ in range(8):
        assert look(woken) is None
    assert aws.started == GANG1 and len(starts(aws)) == 1
    # gang1 serves: both gangs serve, maxReplicas is reached, still nothing more.
    for instance_id in GANG1:
        aws.states[instance_id] = "running"
    heads["gang1"].start()
    prometheus.waiting = {"gang0": 6, "gang1": 6}
    for _ in range(8):
        assert look(woken) is None
    assert woken.states() == {"gang0": "serving", "gang1": "serving"}
    assert len(starts(aws)) == 1
    assert set(prometheus.queries) == {WAITING_QUERY, RUNNING_QUERY, CLIENT_FINISHED_QUERY, waker.KV_QUERY}


def test_a_short_burst_starts_no_gang(warm_pool, aws, prometheus):  # noqa: F811
    woken, _ = warm_pool
    prometheus.waiting = {"gang0": 40}
    assert woken.scale() is None
    for _ in range(3):  # a burst seen at t = 0 ... 45, then the engine keeps up
        assert look(woken) is None
    prometheus.waiting = {"gang0": 0}
    for _ in range(12):
        assert look(woken) is None
    assert starts(aws) == [] and woken.states()["gang1"] == "stopped"


def test_a_look_at_the_queue_that_fails_starts_the_hold_time_again(warm_pool, aws, prometheus):  # noqa: F811
    woken, _ = warm_pool
    prometheus.waiting = {"gang0": 6}
    assert woken.scale() is None
    for _ in range(2):
        assert look(woken) is None
    prometheus.down = True
    assert look(woken) is None  # t = 45: Prometheus not ready; what the queue did is unknown
    prometheus.down = False
    for _ in range(4):  # t = 60 ... 105: a minute of looks again, counted from t = 60
        assert look(woken) is None
    assert starts(aws) == []
    assert look(woken).gang == "gang1"  # t = 120
    assert aws.started == GANG1

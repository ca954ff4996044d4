"""The gateway's waker (scripts/gateway/vllm-cluster-waker) judged by an implementation of
EC2's Query API nobody here wrote: moto's server (moto[server], requirements-dev.txt), run
as a subprocess on 127.0.0.1 with TLS (a test CA's certificate), its IAM authentication
on (moto checks every request's Signature Version 4 with botocore's own signer once
`POST /moto-api/reset-auth` sets the count of requests it lets through unchecked to 0:
moto/moto_api/_internal/responses.py reset_auth_response, moto/core/authorization.py), and
the instance metadata service (IMDSv2) as tests/doubles/ec2_api.py stands it in, handing
out moto's assumed-role credentials of the gateway's role.

What moto cannot judge stays with our own double (tests/test_waker.py): capacity errors,
a start EC2 accepts and then puts back to stopped, and the IAM policy's tag conditions
(moto evaluates neither IAM resource ARNs for EC2 nor conditions on them, so the role here
holds the policy's actions without them)."""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from components import idle_stop
from tests.doubles.ec2_api import InstanceMetadataDouble, IssuedCredentials, issue_test_certificate
from tests.test_waker import (
    PROJECT,
    STACK,
    STACK_ID,
    FixedKeys,
    Head,
    WakerProcess,
    config,
    eventually,
    free_port,
    serving_on,
    waker,
)

# moto's server from the test dependencies (requirements-dev.txt), beside the suite's Python.
MOTO_SERVER = Path(sys.executable).with_name("moto_server")
REGION, ACCOUNT = "us-east-1", "123456789012"
ROLE = "vllm-gateway-role"
TAGS = {"vllm-cluster:stack": STACK, "vllm-cluster:project": PROJECT, idle_stop.STACK_ID_TAG: STACK_ID}
# More of the stack's instances than one page of DescribeInstances holds in moto (100
# reservations a page, moto/ec2/responses/instances.py): the waker must follow NextToken.
MANY = 105


def role_policy_without_conditions() -> dict:
    """The gateway role's actions (idle_stop.gateway_wake_policy) on "*" without their
    conditions: moto would deny every statement with a condition it cannot evaluate."""
    declared = idle_stop.gateway_wake_policy("aws", REGION, ACCOUNT, PROJECT, STACK, STACK_ID)
    actions = sorted({a for s in declared["Statement"] for a in s["Action"]})
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}


class MotoServer:
    """moto_server on 127.0.0.1:port with TLS; started and stopped by the fixture."""

    def __init__(self, folder: Path):
        self.ca, cert, key = issue_test_certificate(folder / "tls", ["localhost"])
        self.port = free_port()
        self.log = folder / "moto.log"
        self.process = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port), "-c", cert, "-k", key],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        eventually(self.listening, 60, "moto's server listening")

    @property
    def endpoint(self) -> str:
        return f"https://localhost:{self.port}"

    def listening(self) -> bool:
        return serving_on(self.process, self.log, self.port)

    def post(self, path: str, body: bytes) -> None:
        context = ssl.create_default_context(cafile=self.ca)
        # Not a form (urllib's default type): moto reads the count from the raw body.
        headers = {"Content-Type": "text/plain"}
        request = urllib.request.Request(self.endpoint + path, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            assert response.status == 200

    def client(self, service: str, access_key: str = "seed", secret_key: str = "seed", token: str | None = None):
        import boto3

        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.endpoint,
            verify=self.ca,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            aws_session_token=token,
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory):
    if not MOTO_SERVER.exists():
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail(f"{MOTO_SERVER} is missing: requirements-dev.txt installs moto[server]")
        pytest.skip("moto's server is not installed (requirements-dev.txt: moto[server])")
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


class RoleSessions:
    """The gateway role's sessions as IMDS hands them out: each an AssumeRole at moto's
    STS with the operator's IAM user keys (the metadata double calls issue())."""

    def __init__(self, server: MotoServer, user_keys: tuple[str, str], role_arn: str):
        self.sts = server.client("sts", *user_keys)
        self.role_arn = role_arn
        self.issued: list[IssuedCredentials] = []

    def issue(self, lifetime: dt.timedelta) -> IssuedCredentials:
        answer = self.sts.assume_role(
            RoleArn=self.role_arn,
            RoleSessionName="i-0gateway0000000000",
            DurationSeconds=max(900, int(lifetime.total_seconds())),
        )["Credentials"]
        issued = IssuedCredentials(
            answer["AccessKeyId"], answer["SecretAccessKey"], answer["SessionToken"], answer["Expiration"]
        )
        self.issued.append(issued)
        return issued


class MotoAccount:
    """moto's account, fresh for each test: an IAM user (long-term AKIA keys) allowed the
    gateway role's actions and sts:AssumeRole, the gateway's role with the same actions,
    `count` instances of the stack (each its own reservation), two of another stack, and
    IMDSv2 handing out the role's sessions. Authentication on from then on."""

    def __init__(self, server: MotoServer, count: int):
        self.server = server
        server.post("/moto-api/reset", b"")
        server.post("/moto-api/reset-auth", b"inf")
        iam = server.client("iam")
        iam.create_user(UserName="operator")
        policy = role_policy_without_conditions()
        assume = {"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}
        user_policy = {**policy, "Statement": [*policy["Statement"], assume]}
        iam.put_user_policy(UserName="operator", PolicyName="wake", PolicyDocument=json.dumps(user_policy))
        key = iam.create_access_key(UserName="operator")["AccessKey"]
        self.user_keys = (key["AccessKeyId"], key["SecretAccessKey"])
        trust = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
        }
        role = iam.create_role(RoleName=ROLE, AssumeRolePolicyDocument=json.dumps(trust), MaxSessionDuration=43200)
        iam.put_role_policy(RoleName=ROLE, PolicyName="wake", PolicyDocument=json.dumps(policy))
        ec2 = server.client("ec2")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

        def launch(tags: dict[str, str]) -> str:
            answer = ec2.run_instances(
                ImageId=image,
                MinCount=1,
                MaxCount=1,
                InstanceType="t3.micro",
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                ],
            )
            return answer["Instances"][0]["InstanceId"]

        self.stack = [launch(TAGS) for _ in range(count)]
        self.other = [launch({**TAGS, "vllm-cluster:stack": "another-stack"}) for _ in range(2)]
        self.sessions = RoleSessions(server, self.user_keys, role["Role"]["Arn"])
        self.imds = InstanceMetadataDouble("127.0.0.1", 0, role=ROLE, credentials=self.sessions).start()
        # From here on moto checks every request's signature and the caller's policy.
        server.post("/moto-api/reset-auth", b"0")

    def states(self, ids: list[str]) -> dict[str, str]:
        """The instances' states as moto has them (with the user's keys: auth is on)."""
        ec2 = self.server.client("ec2", *self.user_keys)
        answer = ec2.describe_instances(InstanceIds=ids)
        return {i["InstanceId"]: i["State"]["Name"] for r in answer["Reservations"] for i in r["Instances"]}

    def stop(self, ids: list[str]) -> None:
        self.server.client("ec2", *self.user_keys).stop_instances(InstanceIds=ids)

    def close(self) -> None:
        self.imds.stop()
        self.server.post("/moto-api/reset-auth", b"inf")


@pytest.fixture
def moto(moto_server):
    account = MotoAccount(moto_server, 3)
    yield account
    account.close()


@pytest.fixture
def moto_many(moto_server):
    """An account with more of the stack's instances than a page holds (about 12 s to make)."""
    account = MotoAccount(moto_server, MANY)
    yield account
    account.close()


def role_client(moto: MotoAccount):
    """The waker's EC2 client as the gateway makes it: the instance role through IMDSv2."""
    return waker.Ec2(moto.server.endpoint, REGION, waker.instance_role(moto.imds.url), moto.server.ca)


def keys_client(moto: MotoAccount, access_key: str, secret_key: str, token: str | None = None):
    """The waker's EC2 client signing with the keys given."""
    return waker.Ec2(moto.server.endpoint, REGION, FixedKeys(access_key, secret_key, token), moto.server.ca)


def refused_code(call) -> str:
    with pytest.raises(waker.Ec2Error) as refused:
        call()
    return refused.value.code


# --- Signature Version 4 ------------------------------------------------------------------------


def test_moto_accepts_the_signature_made_with_an_iam_users_keys_and_refuses_a_wrong_secret(moto):
    access_key, secret_key = moto.user_keys
    assert set(keys_client(moto, access_key, secret_key).describe(moto.stack, STACK)) == set(moto.stack)
    assert refused_code(lambda: keys_client(moto, access_key, "not-the-secret").describe(moto.stack, STACK)) == (
        "AuthFailure"
    )
    assert refused_code(lambda: keys_client(moto, "AKIANOTAKEYOFMOTO000", secret_key).describe(moto.stack, STACK)) == (
        "AuthFailure"
    )


def test_moto_accepts_the_roles_session_from_imds_and_refuses_an_altered_token(moto):
    assert set(role_client(moto).describe(moto.stack, STACK)) == set(moto.stack)
    # The credentials came from IMDSv2: a token first (PUT), then the role and its session.
    assert [request[0] for request in moto.imds.requests][:1] == ["PUT"]
    session = moto.sessions.issued[-1]
    altered = session.token[:-4] + ("AAAA" if not session.token.endswith("AAAA") else "BBBB")
    altered_client = keys_client(moto, session.access_key, session.secret_key, altered)
    assert refused_code(lambda: altered_client.describe(moto.stack, STACK)) == "AuthFailure"
    # The role's keys without the session token are no IAM user's keys either.
    no_token = keys_client(moto, session.access_key, session.secret_key)
    assert refused_code(lambda: no_token.describe(moto.stack, STACK)) == "AuthFailure"


# --- DescribeInstances, StartInstances, StopInstances -------------------------------------------


def test_describe_follows_every_page_and_keeps_only_the_stacks_tagged_instances(moto_many):
    account = moto_many
    account.stop(account.stack[-2:])
    found = role_client(account).describe([*account.stack, *account.other, "i-0fffffffffffffff0"], STACK)
    assert set(found) == set(account.stack) and len(found) == MANY
    assert {found[i].state for i in account.stack[:-2]} == {"running"}
    assert {found[i].state for i in account.stack[-2:]} == {"stopped"}
    assert found[account.stack[0]].tags == TAGS
    # moto says why it stopped (Client.UserInitiatedShutdown), and when.
    assert found[account.stack[-1]].state_code == "Client.UserInitiatedShutdown"
    assert found[account.stack[-1]].reason.startswith("User initiated (")
    assert role_client(account).describe(account.other, STACK) == {}
    # Pages of 5 (DescribeInstances' smallest MaxResults): the same instances.
    paged = waker.Ec2(account.server.endpoint, REGION, waker.instance_role(account.imds.url), account.server.ca, 5)
    assert set(paged.describe(account.stack[:12], STACK)) == set(account.stack[:12])


def test_start_and_stop_change_the_instances_as_moto_reports_them(moto):
    gang = moto.stack[:2]
    moto.stop(gang)
    client = role_client(moto)
    assert set(client.start(gang)) == set(gang)
    assert moto.states(gang) == dict.fromkeys(gang, "running")
    assert client.stop(gang[:1])[gang[0]] in ("stopping", "stopped")
    assert moto.states(gang)[gang[0]] == "stopped"
    assert refused_code(lambda: client.start(["i-0fffffffffffffff0"])) == "InvalidInstanceID.NotFound"


def test_a_request_to_a_stopped_gang_starts_it_at_moto_and_gets_503(moto, tmp_path):
    gang = moto.stack[:2]
    moto.stop(gang)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    settings = config(endpoint=moto.server.endpoint, gangs={"gang0": gang}, imds=moto.imds.url, ca_file=moto.server.ca)
    woken = waker.Waker(waker.parse_config(json.dumps(settings)), str(state_dir), role_client(moto))
    woken.poll()
    assert woken.power["gang0"]["state"] == "stopped"
    status, headers, body = woken.fallback(502)
    assert status == 503 and headers["Retry-After"] == "30"
    assert json.loads(body)["error"]["code"] == "waking_from_idle_stop"
    assert moto.states(gang) == dict.fromkeys(gang, "running")
    assert woken.power["gang0"]["wake"]["started"] == sorted(gang)


def test_the_waker_on_debians_botocore_wakes_a_stopped_gang_at_moto(moto, tmp_path):
    """The waker as the local fleet's gateway runs it (Debian 12's python3 and its
    python3-botocore 1.29, PYTHON), serving on loopback: a completion nginx hands over
    starts the stopped gang at moto and gets the 503; the gang then serves."""
    gang = moto.stack[:2]
    moto.stop(gang)
    head = Head()
    where = SimpleNamespace(endpoint=moto.server.endpoint, imds=moto.imds, ca=moto.server.ca)
    process = WakerProcess(tmp_path, where, {"gang0": gang}, head)
    try:
        eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
        status, headers, body = process.completion()
        assert status == 503 and headers["Retry-After"] == "30", body
        assert moto.states(gang) == dict.fromkeys(gang, "running")
        head.start()
        eventually(lambda: process.power()["gang0"]["state"] == "serving", 30, "gang0 serving")
    finally:
        process.stop()
        head.stop()

"""Test doubles of the AWS the gateway's waker talks to (scripts/gateway/vllm-cluster-waker):
EC2's Query API for DescribeInstances and StartInstances over HTTPS, and the instance
metadata service (IMDSv2) that hands out the instance role's credentials.

They imitate what the waker depends on, each behaviour from AWS's documentation:
- the Query API: a form-encoded POST with Action and Version=2016-11-15
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/Query-Requests.html), answered in
  XML in the namespace http://ec2.amazonaws.com/doc/2016-11-15/, with the element names of
  EC2's service model (botocore data/ec2/2016-11-15/service-2.json: reservationSet,
  instancesSet, instanceState, `reason` for stateTransitionReason, stateReason, tagSet;
  StartInstances' instancesSet of currentState/previousState,
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceStateChange.html);
- errors as <Response><Errors><Error><Code/><Message/></Error></Errors><RequestID/></Response>
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html, "Example
  error response"; botocore's EC2QueryParser reads exactly that), with EC2's codes:
  AuthFailure (credentials that do not validate, a wrong signature), RequestExpired (a
  date stamp more than 15 minutes off, or expired temporary credentials),
  MissingAuthenticationToken, UnauthorizedOperation (HTTP 403: the caller's IAM policy
  does not allow the action on the resource), InvalidInstanceID.NotFound,
  InvalidInstanceID.Malformed, IncorrectInstanceState (StartInstances on an instance
  that is stopping, StopInstances on one still pending), InvalidParameterValue (an unknown filter), MissingAction,
  InvalidAction (same page, common and action-specific client errors);
- Signature Version 4, verified with the secret the metadata double issued
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html);
- the IAM policy the stack declares for the gateway's role, evaluated per request: Allow
  and Deny statements with Action and Resource patterns (* and ?) and Condition
  StringEquals / StringLike / StringNotEquals on aws:ResourceTag/KEY (or ec2:ResourceTag/KEY)
  and aws:RequestedRegion; a key the request does not have fails its condition; an
  explicit Deny wins; nothing allowed is denied
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html,
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html).
  StartInstances is authorized per instance (resource arn:aws:ec2:REGION:ACCOUNT:instance/ID)
  and one denied instance fails the whole call; DescribeInstances has no resource-level
  permission (resource "*", no resource tags: Service Authorization Reference, "Actions,
  resources, and condition keys for Amazon EC2");
- a stopped instance's stateTransitionReason as EC2 writes it, "User initiated
  (YYYY-MM-DD HH:MM:SS GMT)", and its stateReason Client.InstanceInitiatedShutdown (the
  node powers itself off; botocore's StateReason documentation lists the codes);
- IMDSv2: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1-21600; a PUT
  with X-Forwarded-For is refused), every GET with X-aws-ec2-metadata-token (401 without a
  valid one: the instance requires IMDSv2), the role's name under
  /latest/meta-data/iam/security-credentials/ and its credentials as JSON (Code,
  LastUpdated, Type AWS-HMAC, AccessKeyId, SecretAccessKey, Token, Expiration), renewed
  before they expire (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-security-credentials.html).

How a test or the fleet runs them:

    ca_file, cert_file, key_file = issue_test_certificate(folder, ["ec2.us-east-1.amazonaws.com"])
    credentials = CredentialStore()
    imds = InstanceMetadataDouble("127.0.0.1", 0, role="gateway-role", credentials=credentials).start()
    ec2 = Ec2ApiDouble("127.0.0.1", 0, cert_file, key_file, credentials=credentials,
                       policy=policy_document, instances={"i-0abc...": {"vllm-cluster:stack": "dev", ...}},
                       state=lambda instance_id: "stopped", start=lambda instance_id: None).start()
    ... ec2.port, ec2.calls, imds.url ...
    ec2.stop(); imds.stop()

`state(id)` says each instance's state now (pending, running, stopping, stopped, ...);
`start(id)` is called for every stopped instance a StartInstances starts (the fleet boots
the host; until `state` says otherwise the double reports it pending); `stop(id)` for
every running or pending instance a StopInstances stops.

What EC2 does when it has no capacity, which no other implementation here imitates:
- `refuse_start[id] = (code, message)`: StartInstances naming that instance fails whole
  with that error, as EC2 answers InsufficientInstanceCapacity ("There is not enough
  capacity to fulfill your request", a server error, HTTP 500), InstanceLimitExceeded or
  VcpuLimitExceeded (client errors, HTTP 400) (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html);
- `put_back[id] = (code, message)`: StartInstances accepts the instance (pending), and
  from the next look it is stopped again with that StateReason, as EC2 does with
  Server.InsufficientInstanceCapacity, Client.InternalError (a KMS key the caller may not
  use) or Client.VolumeLimitExceeded
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html).
Both stay until the test removes them ("capacity is back"). NO_CAPACITY_ERROR and
NO_CAPACITY_REASON are what EC2 says for want of capacity in each case; `start_requests`
holds the ids each StartInstances named, whatever its outcome.

What goes wrong between the caller and EC2, which moto does not imitate either:
- `throttle[action] = n`: the next n calls of that action are refused with
  RequestLimitExceeded, as EC2 throttles an account's API requests
  (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html);
- `cut_short[action] = n`: the next n answers to that action (done: a start starts) stop
  half-way through the body their Content-Length announces, and the connection closes,
  as a connection lost mid-answer leaves the caller (http.client.IncompleteRead).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import re
import secrets
import ssl
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

API_VERSION = "2016-11-15"
NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"
# Error codes EC2 lists as server errors (HTTP 5xx; the rest are client errors, HTTP 400)
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
SERVER_ERRORS = {"InsufficientInstanceCapacity", "InternalError", "Unavailable", "InsufficientCapacity"}
# A start refused for want of capacity: StartInstances' error (errors-overview.html above:
# "There is not enough capacity to fulfill your request"), and the StateReason of a start
# EC2 accepted and then could not place ("There was insufficient capacity available to
# satisfy the launch request", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html).
NO_CAPACITY_ERROR = ("InsufficientInstanceCapacity", "There is not enough capacity to fulfill your request.")
NO_CAPACITY_REASON = (
    "Server.InsufficientInstanceCapacity",
    "There was insufficient capacity available to satisfy the launch request.",
)
# EC2's instance state codes (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceState.html).
STATE_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
MAX_SKEW = dt.timedelta(minutes=15)
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --- credentials ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedCredentials:
    access_key: str
    secret_key: str
    token: str
    expiration: dt.datetime


class CredentialStore:
    """The temporary credentials the metadata double hands out and the EC2 double accepts."""

    def __init__(self):
        self.issued: dict[str, IssuedCredentials] = {}
        self.lock = threading.Lock()

    def issue(self, lifetime: dt.timedelta) -> IssuedCredentials:
        # Temporary credentials' key ids start with ASIA (long-term ones with AKIA).
        credentials = IssuedCredentials(
            "ASIA" + secrets.token_hex(8).upper(),
            secrets.token_urlsafe(30),
            secrets.token_urlsafe(60),
            (utc_now() + lifetime).replace(microsecond=0),
        )
        with self.lock:
            self.issued[credentials.access_key] = credentials
        return credentials

    def get(self, access_key: str) -> IssuedCredentials | None:
        with self.lock:
            return self.issued.get(access_key)


class _Server:
    """A threaded HTTP(S) server on address:port (0: a free one), in a thread of its own."""

    def __init__(self, address: str, port: int, handler, context: ssl.SSLContext | None = None):
        self.server = ThreadingHTTPServer((address, port), handler)
        self.server.daemon_threads = True
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.address, self.port = self.server.server_address[:2]
        self.thread: threading.Thread | None = None

    def start(self):
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- IMDSv2 ---------------------------------------------------------------------------------------


class InstanceMetadataDouble(_Server):
    """IMDSv2 on address:port with one instance role, `role`, whose credentials come from
    `credentials` and last `lifetime_seconds` (renewed when less than 5 minutes are left,
    as EC2 makes new ones available at least five minutes before the old ones expire), and
    the instance's block-device-mapping (`block_devices`: entry -> value, as EC2 lists them,
    e.g. {"ami": "/dev/sda1", "root": "/dev/sda1", "ebs1": "sdf"}; "Instance metadata
    categories", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html)."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        role: str,
        credentials: CredentialStore,
        lifetime_seconds: int = 21600,
        block_devices: dict[str, str] | None = None,
    ):
        self.role, self.store = role, credentials
        self.block_devices = dict(block_devices or {})
        self.lifetime = dt.timedelta(seconds=lifetime_seconds)
        self.tokens: dict[str, dt.datetime] = {}
        self.current: IssuedCredentials | None = None
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        super().__init__(address, port, self._handler())

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def credentials_now(self) -> IssuedCredentials:
        with self.lock:
            margin = min(dt.timedelta(minutes=5), self.lifetime / 2)
            if self.current is None or utc_now() + margin >= self.current.expiration:
                self.current = self.store.issue(self.lifetime)
            return self.current

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status: int, text: str, content_type: str = "text/plain") -> None:
                # Recorded before the caller can read the answer: requests holds them in order.
                double.requests.append((self.command, self.path, status))
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):  # noqa: N802
                if self.path != "/latest/api/token":
                    return self.answer(404, "Not Found")
                if "X-Forwarded-For" in self.headers:
                    return self.answer(403, "Forbidden")
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self.answer(400, "Bad Request")
                token = secrets.token_urlsafe(40)
                with double.lock:
                    double.tokens[token] = utc_now() + dt.timedelta(seconds=int(ttl))
                self.answer(200, token)

            def do_GET(self):  # noqa: N802
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with double.lock:
                    valid = token in double.tokens and double.tokens[token] > utc_now()
                if not valid:
                    return self.answer(401, "Unauthorized")
                mappings = "/latest/meta-data/block-device-mapping/"
                if self.path == mappings:
                    return self.answer(200, "\n".join(sorted(double.block_devices)))
                if self.path.startswith(mappings) and self.path[len(mappings) :] in double.block_devices:
                    return self.answer(200, double.block_devices[self.path[len(mappings) :]])
                prefix = "/latest/meta-data/iam/security-credentials/"
                if self.path == prefix:
                    return self.answer(200, double.role)
                if self.path == prefix + double.role:
                    issued = double.credentials_now()
                    document = {
                        "Code": "Success",
                        "LastUpdated": (issued.expiration - double.lifetime).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "Type": "AWS-HMAC",
                        "AccessKeyId": issued.access_key,
                        "SecretAccessKey": issued.secret_key,
                        "Token": issued.token,
                        "Expiration": issued.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    return self.answer(200, json.dumps(document, indent=2))
                self.answer(404, "Not Found")

        return Handler


# --- IAM policy evaluation ----------------------------------------------------------------------------


def _pattern(text: str, ignore_case: bool) -> re.Pattern:
    """IAM's wildcards: * any run of characters, ? one character."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)
    return re.compile(f"^{body}$", re.IGNORECASE if ignore_case else 0)


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _condition_holds(condition: dict, context: dict[str, str]) -> bool:
    for operator, keys in condition.items():
        for key, wanted in keys.items():
            # Condition keys are not case-sensitive; a tag key inside one is matched as written.
            present = {k.lower(): v for k, v in context.items()}.get(key.lower())
            values = [str(v) for v in _as_list(wanted)]
            if operator == "StringEquals":
                holds = present is not None and present in values
            elif operator == "StringLike":
                holds = present is not None and any(_pattern(v, False).match(present) for v in values)
            elif operator == "StringNotEquals":
                holds = present is not None and present not in values
            else:
                raise NotImplementedError(f"the EC2 double does not evaluate condition operator {operator}")
            if not holds:
                return False
    return True


def policy_allows(policy: dict, action: str, resource: str, context: dict[str, str]) -> bool:
    allowed = False
    for statement in _as_list(policy.get("Statement", [])):
        if "NotAction" in statement or "NotResource" in statement:
            raise NotImplementedError("the EC2 double does not evaluate NotAction or NotResource")
        if not any(_pattern(a, True).match(action) for a in _as_list(statement.get("Action", []))):
            continue
        if not any(_pattern(r, False).match(resource) for r in _as_list(statement.get("Resource", []))):
            continue
        if not _condition_holds(statement.get("Condition", {}), context):
            continue
        if statement.get("Effect") == "Deny":
            return False
        if statement.get("Effect") == "Allow":
            allowed = True
    return allowed


# --- the EC2 Query API ----------------------------------------------------------------------------------


class Ec2Fault(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


def _canonical_request(method: str, path: str, query: str, headers, signed: list[str], body: bytes) -> str:
    lines = "".join(f"{name}:{' '.join((headers.get(name) or '').split())}\n" for name in signed)
    canonical_query = "&".join(
        sorted(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)
        )
    )
    return "\n".join([method, path or "/", canonical_query, lines, ";".join(signed), hashlib.sha256(body).hexdigest()])


class Ec2ApiDouble(_Server):
    """EC2's Query API on HTTPS address:port (the certificate and key the caller gives).

    instances: id -> tags of every instance the account has;
    state(id): each instance's state now; start(id): called for every stopped instance a
    StartInstances starts; policy: the IAM policy document of the caller's role;
    credentials: the store whose credentials are accepted (the metadata double's)."""

    def __init__(
        self,
        address: str,
        port: int,
        cert_file: str,
        key_file: str,
        *,
        credentials: CredentialStore,
        policy: dict,
        instances: dict[str, dict[str, str]],
        state: Callable[[str], str],
        start: Callable[[str], None],
        stop: Callable[[str], None] | None = None,
        region: str = "us-east-1",
        account: str = "123456789012",
        role: str = "vllm-gateway-role",
    ):
        self.store, self.policy, self.instances = credentials, policy, instances
        self.state, self.start_instance = state, start
        self.stop_instance = stop or (lambda instance_id: None)
        # What EC2 refuses for want of capacity or quota (see the module's docstring).
        self.refuse_start: dict[str, tuple[str, str]] = {}
        self.put_back: dict[str, tuple[str, str]] = {}
        # Instances accepted and put back to stopped: their StateReason.
        self.fell_back: dict[str, tuple[str, str]] = {}
        # The ids each StartInstances named, in order, refused or not.
        self.start_requests: list[list[str]] = []
        # What goes wrong on the way (see the module's docstring): calls left per action.
        self.throttle: dict[str, int] = {}
        self.cut_short: dict[str, int] = {}
        self.region, self.account, self.role = region, account, role
        # Instances started and not yet reported otherwise by state(): pending.
        self.starting: set[str] = set()
        # When each instance was last seen going down, for its stateTransitionReason.
        self.stopped_since: dict[str, dt.datetime] = {}
        # (action, HTTP status, error code or "") of every call.
        self.calls: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        super().__init__(address, port, self._handler(), context)

    # --- state ---

    def _state_of(self, instance_id: str) -> str:
        with self.lock:
            if instance_id in self.fell_back:
                return "stopped"
        state = self.state(instance_id)
        with self.lock:
            if state == "stopped" and instance_id in self.starting:
                return "pending"
            self.starting.discard(instance_id)
            if state in ("stopping", "stopped"):
                self.stopped_since.setdefault(instance_id, utc_now().replace(microsecond=0))
            else:
                self.stopped_since.pop(instance_id, None)
        return state

    def _reason(self, instance_id: str, state: str) -> tuple[str, str, str]:
        """stateTransitionReason, stateReason code and message."""
        if instance_id in self.fell_back:
            code, message = self.fell_back[instance_id]
            return "", code, f"{code}: {message}"
        since = self.stopped_since.get(instance_id)
        if state in ("stopping", "stopped") and since is not None:
            return (
                f"User initiated ({since.strftime('%Y-%m-%d %H:%M:%S')} GMT)",
                "Client.InstanceInitiatedShutdown",
                "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
            )
        return "", "", ""

    def _take(self, counts: dict[str, int], action: str) -> bool:
        """Whether this call of action is one of the next counts[action]; counts it down."""
        with self.lock:
            if counts.get(action, 0) <= 0:
                return False
            counts[action] -= 1
            return True

    # --- authentication and authorization ---

    def _authenticate(self, handler, body: bytes) -> IssuedCredentials:
        authorization = handler.headers.get("Authorization", "")
        match = re.fullmatch(
            r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
            r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
            authorization,
        )
        if not authorization:
            raise Ec2Fault(401, "MissingAuthenticationToken", "Request is missing Authentication Token")
        if match is None:
            raise Ec2Fault(400, "IncompleteSignature", "Request signature does not conform to AWS standards")
        access_key, date, region, service, signed_text, signature = match.groups()
        signed = signed_text.split(";")
        issued = self.store.get(access_key)
        if issued is None:
            raise Ec2Fault(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        amz_date = handler.headers.get("X-Amz-Date", "")
        try:
            stamp = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            raise Ec2Fault(400, "IncompleteSignature", "X-Amz-Date is missing or malformed") from None
        if abs(utc_now() - stamp) > MAX_SKEW or utc_now() >= issued.expiration:
            raise Ec2Fault(400, "RequestExpired", "Request has expired.")
        if "host" not in signed or "x-amz-date" not in signed or date != amz_date[:8]:
            raise Ec2Fault(400, "IncompleteSignature", "Request signature does not conform to AWS standards")
        if region != self.region or service != "ec2":
            raise Ec2Fault(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        if handler.headers.get("X-Amz-Security-Token") != issued.token or "x-amz-security-token" not in signed:
            raise Ec2Fault(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        path, _, query = handler.path.partition("?")
        canonical = _canonical_request(handler.command, path, query, handler.headers, signed, body)
        scope = f"{date}/{region}/{service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + issued.secret_key).encode()
        for part in (date, region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            raise Ec2Fault(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        return issued

    def _authorize(self, action: str, resource: str, tags: dict[str, str]) -> None:
        context = {"aws:RequestedRegion": self.region}
        for key, value in tags.items():
            context[f"aws:ResourceTag/{key}"] = value
            context[f"ec2:ResourceTag/{key}"] = value
        if policy_allows(self.policy, f"ec2:{action}", resource, context):
            return
        who = f"arn:aws:sts::{self.account}:assumed-role/{self.role}/i-0gateway0000000000"
        detail = base64.b64encode(
            json.dumps({"allowed": False, "action": f"ec2:{action}", "resource": resource}).encode()
        )
        raise Ec2Fault(
            403,
            "UnauthorizedOperation",
            f"You are not authorized to perform this operation. User: {who} is not authorized to perform: "
            f"ec2:{action} on resource: {resource} because no identity-based policy allows the ec2:{action} "
            f"action. Encoded authorization failure message: {detail.decode()}",
        )

    # --- actions ---

    @staticmethod
    def _numbered(params: dict[str, str], prefix: str) -> list[str]:
        pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)$")
        found = sorted((int(m.group(1)), v) for k, v in params.items() if (m := pattern.match(k)))
        return [value for _, value in found]

    def _known_ids(self, ids: list[str]) -> None:
        for instance_id in ids:
            if not INSTANCE_ID.match(instance_id):
                raise Ec2Fault(400, "InvalidInstanceID.Malformed", f'Invalid id: "{instance_id}"')
        unknown = [i for i in ids if i not in self.instances]
        if unknown:
            quoted = ", ".join(f"'{i}'" for i in unknown)
            raise Ec2Fault(
                400,
                "InvalidInstanceID.NotFound",
                f"The instance ID {quoted} does not exist"
                if len(unknown) == 1
                else f"The instance IDs {quoted} do not exist",
            )

    def _describe(self, params: dict[str, str]) -> str:
        self._authorize("DescribeInstances", "*", {})
        ids = self._numbered(params, "InstanceId")
        self._known_ids(ids)
        chosen = ids or sorted(self.instances)
        filters = []
        n = 1
        while f"Filter.{n}.Name" in params:
            name = params[f"Filter.{n}.Name"]
            values = self._numbered(params, f"Filter.{n}.Value")
            if name not in ("instance-id", "instance-state-name", "tag-key") and not name.startswith("tag:"):
                raise Ec2Fault(400, "InvalidParameterValue", f"The filter '{name}' is invalid")
            filters.append((name, values))
            n += 1
        items = []
        for instance_id in chosen:
            tags = self.instances[instance_id]
            state = self._state_of(instance_id)
            keep = True
            for name, values in filters:
                if name == "instance-id":
                    keep &= instance_id in values
                elif name == "instance-state-name":
                    keep &= state in values
                elif name == "tag-key":
                    keep &= any(k in tags for k in values)
                else:
                    keep &= tags.get(name[4:]) in values
            if keep:
                items.append(self._instance_xml(instance_id, tags, state))
        return f"<reservationSet>{''.join(items)}</reservationSet>"

    def _instance_xml(self, instance_id: str, tags: dict[str, str], state: str) -> str:
        reason, code, message = self._reason(instance_id, state)
        state_reason = (
            f"<stateReason><code>{code}</code><message>{escape(message)}</message></stateReason>" if code else ""
        )
        tag_set = "".join(
            f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in sorted(tags.items())
        )
        reservation = "r-" + hashlib.sha256(instance_id.encode()).hexdigest()[:17]
        return (
            f"<item><reservationId>{reservation}</reservationId><ownerId>{self.account}</ownerId><groupSet/>"
            f"<instancesSet><item><instanceId>{instance_id}</instanceId>"
            f"<instanceState><code>{STATE_CODES[state]}</code><name>{state}</name></instanceState>"
            f"<reason>{escape(reason)}</reason>{state_reason}<tagSet>{tag_set}</tagSet>"
            f"</item></instancesSet></item>"
        )

    def _start(self, params: dict[str, str]) -> str:
        ids = self._numbered(params, "InstanceId")
        if not ids:
            raise Ec2Fault(400, "MissingParameter", "The request must contain the parameter InstanceId")
        with self.lock:
            self.start_requests.append(list(ids))
        self._known_ids(ids)
        for instance_id in ids:
            resource = f"arn:aws:ec2:{self.region}:{self.account}:instance/{instance_id}"
            self._authorize("StartInstances", resource, self.instances[instance_id])
        states = {i: self._state_of(i) for i in ids}
        for instance_id, state in states.items():
            if state not in ("stopped", "pending", "running"):
                raise Ec2Fault(
                    400,
                    "IncorrectInstanceState",
                    f"The instance '{instance_id}' is not in a state from which it can be started.",
                )
        for instance_id in ids:
            if instance_id in self.refuse_start:
                code, message = self.refuse_start[instance_id]
                raise Ec2Fault(500 if code in SERVER_ERRORS else 400, code, message)
        items = []
        for instance_id, before in states.items():
            after = before
            if before == "stopped":
                with self.lock:
                    self.fell_back.pop(instance_id, None)
                    if instance_id in self.put_back:
                        # Accepted; the next look finds it stopped again, saying why.
                        self.fell_back[instance_id] = self.put_back[instance_id]
                    else:
                        self.starting.add(instance_id)
                if instance_id not in self.fell_back:
                    self.start_instance(instance_id)
                after = "pending"
            items.append(
                f"<item><instanceId>{instance_id}</instanceId>"
                f"<currentState><code>{STATE_CODES[after]}</code><name>{after}</name></currentState>"
                f"<previousState><code>{STATE_CODES[before]}</code><name>{before}</name></previousState></item>"
            )
        return f"<instancesSet>{''.join(items)}</instancesSet>"

    def _stop(self, params: dict[str, str]) -> str:
        ids = self._numbered(params, "InstanceId")
        if not ids:
            raise Ec2Fault(400, "MissingParameter", "The request must contain the parameter InstanceId")
        self._known_ids(ids)
        for instance_id in ids:
            resource = f"arn:aws:ec2:{self.region}:{self.account}:instance/{instance_id}"
            self._authorize("StopInstances", resource, self.instances[instance_id])
        states = {i: self._state_of(i) for i in ids}
        for instance_id, state in states.items():
            # An instance still pending cannot be stopped: EC2's lifecycle goes from pending
            # to running only (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html),
            # and StopInstances answers "IncorrectInstanceState: Instance '...' cannot be
            # stopped as it has never reached the 'running' state" (as reported in
            # https://github.com/cloud-custodian/cloud-custodian/pull/6014); one such
            # instance fails the whole call, as for StartInstances.
            if state == "pending":
                raise Ec2Fault(
                    400,
                    "IncorrectInstanceState",
                    f"Instance '{instance_id}' cannot be stopped as it has never reached the 'running' state.",
                )
        items = []
        for instance_id, before in states.items():
            after = before
            if before == "running":
                with self.lock:
                    self.starting.discard(instance_id)
                self.stop_instance(instance_id)
                after = "stopping"
            items.append(
                f"<item><instanceId>{instance_id}</instanceId>"
                f"<currentState><code>{STATE_CODES[after]}</code><name>{after}</name></currentState>"
                f"<previousState><code>{STATE_CODES[before]}</code><name>{before}</name></previousState></item>"
            )
        return f"<instancesSet>{''.join(items)}</instancesSet>"

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status: int, xml: str, cut_short: bool = False) -> None:
                body = ('<?xml version="1.0" encoding="UTF-8"?>\n' + xml).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/xml;charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if cut_short:
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
                action = params.get("Action", "")
                request_id = str(uuid.uuid4())
                try:
                    double._authenticate(self, body)
                    if not action:
                        raise Ec2Fault(400, "MissingAction", "The request must contain the parameter Action")
                    if double._take(double.throttle, action):
                        raise Ec2Fault(400, "RequestLimitExceeded", "Request limit exceeded.")
                    if params.get("Version") != API_VERSION:
                        raise Ec2Fault(400, "InvalidParameterValue", f"Invalid API version {params.get('Version')}")
                    if action == "DescribeInstances":
                        inner = double._describe(params)
                    elif action == "StartInstances":
                        inner = double._start(params)
                    elif action == "StopInstances":
                        inner = double._stop(params)
                    else:
                        raise Ec2Fault(400, "InvalidAction", f"The action {action} is not valid for this web service.")
                except Ec2Fault as fault:
                    double.calls.append((action, fault.status, fault.code))
                    self.reply(
                        fault.status,
                        f"<Response><Errors><Error><Code>{fault.code}</Code><Message>{escape(fault.message)}"
                        f"</Message></Error></Errors><RequestID>{request_id}</RequestID></Response>",
                    )
                    return
                cut_short = double._take(double.cut_short, action)
                double.calls.append((action, 200, "cut short" if cut_short else ""))
                self.reply(
                    200,
                    f'<{action}Response xmlns="{NAMESPACE}"><requestId>{request_id}</requestId>'
                    f"{inner}</{action}Response>",
                    cut_short,
                )

        return Handler


def issue_test_certificate(folder, names: list[str]) -> tuple[str, str, str]:
    """(ca_file, cert_file, key_file): a test CA and a server certificate it signed for
    `names` (DNS names, or IP addresses) made by openssl in `folder`. The waker trusts
    the CA (its ca_file, or the gateway's trust store in the fleet), and verifies the
    double's certificate and name as it would EC2's."""
    import ipaddress
    import subprocess
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run(
        "req",
        "-x509",
        *ec,
        "-days",
        "2",
        "-subj",
        "/CN=vllm-cluster test CA",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    run("req", "-new", *ec, "-subj", f"/CN={names[0]}", "-keyout", str(key), "-out", str(csr))
    alt = []
    for name in names:
        try:
            ipaddress.ip_address(name)
            alt.append(f"IP:{name}")
        except ValueError:
            alt.append(f"DNS:{name}")
    extensions = folder / "server.ext"
    extensions.write_text(f"subjectAltName={','.join(alt)}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extensions),
        "-out",
        str(cert),
    )
    return str(ca), str(cert), str(key)

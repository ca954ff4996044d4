"""Run the real `__main__.py` under Pulumi's mock runtime, offline, and record the
resource graph it declares.

A stand-in for the Pulumi engine and the cloud providers, nothing more: the
program, its components and its config reading run unchanged. The mocks answer
what a provider would compute (ids, IPs, ARNs) with deterministic values, so two
runs of the same config declare the same graph. The tests use it (through
tests/pulumi_mocks.py) and so does the offline planner (`scripts/vllm-cluster plan`).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import runpy
import secrets
import string
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from cli.stack_file import (  # noqa: F401
    PROJECT,
    ROOT,
    STACKS_DIR,
    ProjectConfigError,
    apply_project_config,
    ec2_stack_names,
    readable_config,
    stack_config,
    stack_names,
)

# Reading stack files is pure and lives in cli/stack_file.py; these names are
# re-exported because the tests reach the harness through this module.
from components.quotas import ELASTIC_IPS, NAT_GATEWAYS, VPCS

PROGRAM = ROOT / "__main__.py"

# Public IPs come from 203.0.113.0/24, a documentation range (RFC 5737) that reaches nothing.
MOCK_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def _namespaced(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key if ":" in key else f"{PROJECT}:{key}": value for key, value in config.items()}


def as_engine_config(config: Mapping[str, Any]) -> dict[str, str]:
    """What the Pulumi CLI hands a program: every value a string, lists and maps as JSON."""
    rendered = {}
    for key, value in config.items():
        full_key = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, str):
            rendered[full_key] = value
        else:
            rendered[full_key] = json.dumps(value)
    return rendered


def _whole_numbers(value: Any) -> Any:
    """Protobuf carries every number as a float; give back the ints the program wrote."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _digest(*parts: str, length: int = 17) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


@dataclass
class DeclaredResource:
    type: str
    name: str
    urn: str
    parent: str
    custom: bool
    inputs: dict
    retain_on_delete: bool
    additional_secret_outputs: list[str]
    dependencies: list[str]
    ignore_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool = False

    @property
    def parent_type(self) -> str:
        """The type of the parent, read from the URN's type chain."""
        qualified = self.parent.split("::")[2] if self.parent else ""
        return qualified.split("$")[-1]


@dataclass
class ProgramRun:
    resources: list[DeclaredResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    secret_outputs: set[str] = field(default_factory=set)
    error: BaseException | None = None
    invokes: list[tuple[str, dict]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def of_type(self, type_: str) -> list[DeclaredResource]:
        return [r for r in self.resources if r.type == type_]

    def named(self, name: str, type_: str | None = None) -> DeclaredResource:
        matches = [r for r in self.resources if r.name == name and (type_ is None or r.type == type_)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources named {name}")
        return matches[0]

    def by_urn(self, urn: str) -> DeclaredResource:
        return next(r for r in self.resources if r.urn == urn)

    def id_of(self, resource: DeclaredResource) -> str:
        return MockCloud.resource_id(resource.type, resource.name)


def stdout_reference(command_name: str) -> str:
    """What a remote command's stdout reads as under a MockCloud with stdout_references:
    a marker no command prints, which localhosts/replay.py replaces by what the command
    printed."""
    return f"@@stdout-of:{command_name}@@"


STDOUT_REFERENCE = re.compile(r"@@stdout-of:([A-Za-z0-9._-]+)@@")


# What the mock's Service Quotas answers for a quota a test does not name: room for any
# stack file's instances, so only a test that sets a vCPU quota meets one; counts of
# resources (Elastic IPs, VPCs, NAT gateways per zone) have AWS's defaults, 5 each
# (components/quotas.py), which an account holding nothing else is far from.
MOCK_QUOTA_VALUE = 100_000.0
MOCK_COUNT_QUOTAS = {quota.code: float(quota.default) for quota in (ELASTIC_IPS, VPCS, NAT_GATEWAYS)}


class MockCloud(pulumi.runtime.Mocks):
    """Answers resource registrations and invokes as AWS, TLS and Random would,
    with deterministic values. `instance_ips` maps an instance's resource name to
    the private IP it should get (the local fleet maps them to its test hosts).
    `existing_vpc` overrides what the getVpc lookup of an existing VPC answers (its DNS
    attributes are on unless a test turns them off)."""

    def __init__(
        self,
        instance_ips: Mapping[str, str] | None = None,
        private_range: str = "10.42.128.0/17",
        public_ips: Mapping[str, str] | None = None,
        real_crypto: bool = False,
        key_store: dict | None = None,
        existing_vpc: Mapping[str, Any] | None = None,
        model_cache: Mapping[str, Any] | None = None,
        stdout_references: bool = False,
        quotas: Mapping[str, Any] | None = None,
        account: Mapping[str, int] | None = None,
        ebs_key_manager: str = "AWS",
        baked_images: Mapping[str, str] | None = None,
    ):
        self.instance_ips = dict(instance_ips or {})
        # A remote command's stdout as a reference to it (stdout_reference) instead of "":
        # the local fleet's replay puts the command's real stdout in its place wherever
        # another command's input uses it, as `pulumi up` does once the command ran.
        self.stdout_references = stdout_references
        # Who manages the account's default EBS key: "AWS" (aws/ebs, a new account's) or
        # "CUSTOMER" (a key the account made its default).
        self.ebs_key_manager = ebs_key_manager
        # What the account holds already, by kind ("eips", "vpcs", "natGateways"): others'
        # count, and "own" + kind the stack's own (found by its tags). None by default.
        self.account = dict(account or {})
        # Service Quotas' answers: quota code -> the account's value, or an exception whose
        # text the lookup fails with (AccessDenied, say). A quota not named has MOCK_QUOTA_VALUE.
        self.quotas = dict(quotas or {})
        self.existing_vpc = dict(existing_vpc or {})
        # The account's own baked node images (components/node_image.py): the value of their
        # vllm-cluster:node-image tag -> the AMI id. None by default: every bake is the first.
        self.baked_images = dict(baked_images or {})
        # What the lookups of an existing model cache (modelCacheFileSystemId) answer: by default
        # a Regional file system with no mount target (a cache kept by a destroyed stack); a test
        # sets "availabilityZoneName" (One Zone), "mountTargets" ([{vpcId, availabilityZone,
        # securityGroups}]) and "stackEfsGroups" (the ids the stack's own efs group has, found by
        # its tags: the group of the stack's own mount target on a later `pulumi up`).
        self.model_cache = dict(model_cache or {})
        # Real key material by resource name, kept across runs that share the dict (a
        # second `pulumi up` keeps the stack's keys).
        self.key_store = key_store if key_store is not None else {}
        # Elastic IP resource name -> the public IP to give it (the local fleet's gateway).
        self.public_ips = dict(public_ips or {})
        # Real keys and certificates (for the local fleet, whose hosts must accept them).
        self.real_crypto = real_crypto
        self._private_range = ipaddress.ip_network(private_range)
        self._given_ips: dict[str, str] = {}
        self.inputs: dict[tuple[str, str], dict] = {}
        self.invokes: list[tuple[str, dict]] = []

    @staticmethod
    def resource_id(type_: str, name: str) -> str:
        prefix = {
            "aws:ec2/instance:Instance": "i-",
            "aws:ec2/securityGroup:SecurityGroup": "sg-",
            "aws:ec2/vpc:Vpc": "vpc-",
            "aws:ec2/subnet:Subnet": "subnet-",
            "aws:efs/fileSystem:FileSystem": "fs-",
            "aws:efs/accessPoint:AccessPoint": "fsap-",
            "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
            "aws:ec2/eip:Eip": "eipalloc-",
        }.get(type_, "")
        return prefix + _digest(type_, name)

    def _private_ip(self, name: str) -> str:
        """Derived from the name, not the order of registration (which the SDK does
        not fix), so a node keeps its IP from one run to the next."""
        if name in self.instance_ips:
            return self.instance_ips[name]
        if name not in self._given_ips:
            taken = set(self._given_ips.values())
            offset = int(_digest("ip", name), 16)
            size = self._private_range.num_addresses - 20
            while True:
                candidate = str(self._private_range.network_address + 10 + offset % size)
                if candidate not in taken:
                    break
                offset += 1
            self._given_ips[name] = candidate
        return self._given_ips[name]

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.inputs[(args.typ, args.name)] = args.inputs
        state = dict(args.inputs)
        resource_id = self.resource_id(args.typ, args.name)
        arn_tail = f"{args.typ.split(':')[1].split('/')[0]}/{resource_id}"
        state.setdefault("arn", f"arn:aws:{arn_tail}")
        # What each provider computes on top of the inputs, by provider: its outputs
        # overwrite the inputs of the same name, as a provider's state does.
        if args.typ.startswith("aws:"):
            state.update(self._aws_outputs(args, resource_id))
        elif args.typ.startswith("tls:"):
            state.update(self._tls_outputs(args))
        elif args.typ.startswith("random:"):
            state.update(self._random_outputs(args))
        elif args.typ == "command:remote:Command" and self.stdout_references:
            state["stdout"] = stdout_reference(args.name)
        return resource_id, state

    def _aws_outputs(self, args: pulumi.runtime.MockResourceArgs, resource_id: str) -> dict[str, Any]:
        """What AWS assigns when it creates the resource: IPs, names, versions."""
        state: dict[str, Any] = {}
        if args.typ == "aws:ec2/instance:Instance":
            state["privateIp"] = self._private_ip(args.name)
            state["publicIp"] = ""
        elif args.typ == "aws:ec2/eip:Eip":
            state["publicIp"] = self.public_ips.get(
                args.name, f"203.0.113.{10 + int(_digest('eip', args.name), 16) % 240}"
            )
            state["allocationId"] = resource_id
        elif args.typ == "aws:imagebuilder/image:Image":
            # The AMI the build made (one region, no distribution configuration).
            state["outputResources"] = [{"amis": [{"image": "ami-0" + _digest("baked", args.name, length=16)}]}]
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif args.typ == "aws:efs/fileSystem:FileSystem":
            state["dnsName"] = f"{resource_id}.efs.us-east-1.amazonaws.com"
        elif args.typ == "aws:ec2/keyPair:KeyPair":
            state["keyName"] = args.inputs.get("keyName", args.name)
        elif args.typ == "aws:ec2/placementGroup:PlacementGroup":
            state["name"] = args.inputs.get("name", args.name)
        elif args.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            state["name"] = args.inputs.get("name", args.name)
        return state

    def _tls_outputs(self, args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
        """Keys and certificates: real ones with real_crypto (the local fleet's hosts
        must accept them), else deterministic stand-ins."""
        state: dict[str, Any] = {}
        if args.typ == "tls:index/privateKey:PrivateKey" and self.real_crypto:
            if args.name not in self.key_store:
                self.key_store[args.name] = real_private_key(args.inputs.get("algorithm", "RSA"))
            state.update(self.key_store[args.name])
        elif args.typ == "tls:index/selfSignedCert:SelfSignedCert" and self.real_crypto:
            ips = [unsecret(ip) for ip in args.inputs.get("ipAddresses", [])]
            stored = (args.name, tuple(ips))
            if stored not in self.key_store:
                self.key_store[stored] = real_self_signed_cert(unsecret(args.inputs["privateKeyPem"]), ips)
            state["certPem"] = self.key_store[stored]
        elif args.typ == "tls:index/privateKey:PrivateKey":
            state["publicKeyOpenssh"] = f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{_digest(args.name, length=32)} mock"
            state["privateKeyOpenssh"] = (
                "-----BEGIN OPENSSH PRIVATE KEY-----\n"
                f"mock-{_digest('private', args.name, length=48)}\n"
                "-----END OPENSSH PRIVATE KEY-----\n"
            )
            state["privateKeyPem"] = (
                f"-----BEGIN PRIVATE KEY-----\nmock{_digest('pem', args.name, length=48)}\n-----END PRIVATE KEY-----\n"
            )
        elif args.typ == "tls:index/selfSignedCert:SelfSignedCert":
            # Not a real certificate: deterministic bytes in PEM armour, enough for fingerprints.
            body = base64.b64encode(hashlib.sha256(f"cert/{args.name}".encode()).digest() * 8).decode()
            state["certPem"] = (
                "-----BEGIN CERTIFICATE-----\n"
                + "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
                + "\n-----END CERTIFICATE-----\n"
            )
        return state

    def _random_outputs(self, args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
        """Passwords and ids: drawn for real with real_crypto, else derived from the name."""
        state: dict[str, Any] = {}
        if args.typ == "random:index/randomPassword:RandomPassword" and self.real_crypto:
            # As random_password does: drawn once, then kept (in state; here in key_store),
            # so the secrets of a stack that runs for real (make local) are its own.
            stored = ("password", args.name)
            if stored not in self.key_store:
                self.key_store[stored] = real_password(int(args.inputs.get("length", 32)))
            state["result"] = self.key_store[stored]
        elif args.typ == "random:index/randomId:RandomId":
            # As random_id does: drawn once, then kept (with real crypto: its own per stack).
            size = int(args.inputs.get("byteLength", 8))
            stored = ("id", args.name)
            if self.real_crypto and stored not in self.key_store:
                self.key_store[stored] = secrets.token_hex(size)
            state["hex"] = self.key_store[stored] if self.real_crypto else _digest("id", args.name, length=2 * size)
        elif args.typ == "random:index/randomPassword:RandomPassword":
            length = int(args.inputs.get("length", 32))
            state["result"] = (_digest("password", args.name, length=64) * 4)[:length]
        return state

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.invokes.append((args.token, dict(args.args)))
        # Each lookup answers the invokes of one part of the account, and None to the others.
        lookups = (
            self._image_lookup,
            self._account_lookup,
            self._quota_lookup,
            self._network_lookup,
            self._model_cache_lookup,
        )
        for lookup in lookups:
            answer = lookup(args)
            if answer is not None:
                return answer
        raise NotImplementedError(f"the mock cloud does not answer {args.token}")

    def _image_lookup(self, args: pulumi.runtime.MockCallArgs):
        """The AMIs: the image a filter names (or one derived from the filter), and the
        account's own baked node images."""
        if args.token == "aws:ec2/getAmi:getAmi":
            image_filter = {f["name"]: f["values"] for f in args.args.get("filters", [])}
            image_id = image_filter.get(
                "image-id", ["ami-0" + _digest(json.dumps(args.args, sort_keys=True), length=16)]
            )[0]
            return {"id": image_id, "imageId": image_id, "rootDeviceName": "/dev/sda1", "architecture": "x86_64"}
        if args.token == "aws:ec2/getAmiIds:getAmiIds":
            image_filter = {f["name"]: f["values"] for f in args.args.get("filters", [])}
            ids = [
                self.baked_images[tag]
                for tag in image_filter.get("tag:vllm-cluster:node-image", [])
                if tag in self.baked_images
            ]
            return {"id": "us-east-1", "ids": ids}
        return None

    def _account_lookup(self, args: pulumi.runtime.MockCallArgs):
        """Who and where the program runs: partition, region, caller, the EBS key."""
        if args.token == "aws:index/getPartition:getPartition":
            return {"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"}
        if args.token == "aws:index/getRegion:getRegion":
            # The mock cloud's region: its zones, file systems and ARNs are us-east-1's.
            return {
                "id": "us-east-1",
                "region": "us-east-1",
                "name": "us-east-1",
                "endpoint": "ec2.us-east-1.amazonaws.com",
            }
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "id": "123456789012",
                "accountId": "123456789012",
                "arn": "arn:aws:iam::123456789012:user/mock",
                "userId": "mock",
            }
        if args.token == "aws:ebs/getDefaultKmsKey:getDefaultKmsKey":
            alias = "alias/aws/ebs" if self.ebs_key_manager == "AWS" else "key/mock-customer-key"
            return {"id": "us-east-1", "keyArn": f"arn:aws:kms:us-east-1:123456789012:{alias}"}
        if args.token == "aws:kms/getKey:getKey":
            key_id = "mock-aws-ebs-key" if self.ebs_key_manager == "AWS" else "mock-customer-key"
            return {
                "id": key_id,
                "keyId": key_id,
                "arn": f"arn:aws:kms:us-east-1:123456789012:key/{key_id}",
                "keyManager": self.ebs_key_manager,
            }
        return None

    def _quota_lookup(self, args: pulumi.runtime.MockCallArgs):
        """The account's quotas, and what it holds already that counts against them."""
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            code = args.args["quotaCode"]
            value = self.quotas.get(code, MOCK_COUNT_QUOTAS.get(code, MOCK_QUOTA_VALUE))
            if isinstance(value, Exception):
                # As the provider's error reaches the program: the invoke fails with its reason
                # (pulumi/runtime/invoke.py raises it where the program called), not the run.
                return {}, [("quotaCode", str(value))]
            return {
                "id": f"{args.args['serviceCode']}/{code}",
                "quotaCode": code,
                "serviceCode": args.args["serviceCode"],
                "value": float(value),
                "defaultValue": 5.0,
                "adjustable": True,
                "globalQuota": False,
            }
        held = {
            "aws:ec2/getEips:getEips": "eips",
            "aws:ec2/getVpcs:getVpcs": "vpcs",
            "aws:ec2/getNatGateways:getNatGateways": "natGateways",
        }
        if args.token in held:
            kind = held[args.token]
            own = self.account.get("own" + kind[0].upper() + kind[1:], 0)
            count = own if args.args.get("tags") else own + self.account.get(kind, 0)
            ids = [f"{kind}-{i:08x}" for i in range(count)]
            return {"id": "us-east-1", "ids": ids, "allocationIds": ids, "publicIps": []}
        return None

    def _network_lookup(self, args: pulumi.runtime.MockCallArgs):
        """The zones, and an existing VPC and its subnets."""
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            return {"id": "us-east-1", "locations": list(MOCK_ZONES), "locationTypes": ["availability-zone"] * 3}
        if args.token == "aws:ec2/getVpc:getVpc":
            return {
                "id": args.args.get("id"),
                "cidrBlock": "172.31.0.0/16",
                "enableDnsSupport": True,
                "enableDnsHostnames": True,
                "state": "available",
                **self.existing_vpc,
            }
        if args.token == "aws:ec2/getSubnet:getSubnet":
            return {
                "id": args.args.get("id"),
                "availabilityZone": MOCK_ZONES[1],
                "vpcId": "vpc-existing",
                "cidrBlock": "172.31.128.0/20",
            }
        if args.token == "aws:ec2/getSubnets:getSubnets":
            return {"id": "us-east-1", "ids": ["subnet-other-1"]}
        return None

    def _model_cache_lookup(self, args: pulumi.runtime.MockCallArgs):
        """An existing model cache (modelCacheFileSystemId): its file system, mount
        targets, access points and the stack's own efs group."""
        if args.token == "aws:efs/getFileSystem:getFileSystem":
            file_system_id = args.args.get("fileSystemId")
            return {
                "id": file_system_id,
                "fileSystemId": file_system_id,
                "arn": f"arn:aws:elasticfilesystem:us-east-1:123456789012:file-system/{file_system_id}",
                "dnsName": f"{file_system_id}.efs.us-east-1.amazonaws.com",
                "availabilityZoneName": self.model_cache.get("availabilityZoneName", ""),
                "encrypted": True,
                "performanceMode": "generalPurpose",
                "throughputMode": "elastic",
            }
        if args.token == "aws:ec2/getNetworkInterfaces:getNetworkInterfaces":
            return {"id": "us-east-1", "ids": [f"eni-mt{i:015x}" for i, _ in enumerate(self._mount_targets())]}
        if args.token == "aws:ec2/getNetworkInterface:getNetworkInterface":
            index = int(args.args["id"][len("eni-mt") :], 16)
            target = self._mount_targets()[index]
            return {
                "id": args.args["id"],
                "description": f"EFS mount target for {target['fileSystemId']} ({target['mountTargetId']})",
                "vpcId": target["vpcId"],
                "availabilityZone": target["availabilityZone"],
                "subnetId": target.get("subnetId", "subnet-mounttarget"),
                "securityGroups": target.get("securityGroups", []),
            }
        if args.token == "aws:efs/getAccessPoints:getAccessPoints":
            # model_cache "accessPoints": [{"id", "tags"}] already on the file system.
            points = self.model_cache.get("accessPoints", [])
            return {
                "id": args.args["fileSystemId"],
                "fileSystemId": args.args["fileSystemId"],
                "ids": [point["id"] for point in points],
                "arns": [f"arn:aws:elasticfilesystem:us-east-1:123456789012:access-point/{p['id']}" for p in points],
            }
        if args.token == "aws:efs/getAccessPoint:getAccessPoint":
            point = next(p for p in self.model_cache.get("accessPoints", []) if p["id"] == args.args["accessPointId"])
            return {"id": point["id"], "accessPointId": point["id"], "tags": dict(point.get("tags", {}))}
        if args.token == "aws:ec2/getSecurityGroups:getSecurityGroups":
            # The stack's own efs group, found by its tags once a first `pulumi up` made it.
            groups = self.model_cache.get("stackEfsGroups", [])
            return {"id": "us-east-1", "ids": list(groups), "arns": [], "vpcIds": []}
        return None

    def _mount_targets(self) -> list[dict]:
        return [
            {"fileSystemId": "fs-cache", "mountTargetId": f"fsmt-0{i:016x}", **target}
            for i, target in enumerate(self.model_cache.get("mountTargets", []))
        ]


# How the SDK marks a secret value on the wire (pulumi.runtime.rpc._special_secret_sig).
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"


def unsecret(value: Any) -> Any:
    """The plain value of an input that may arrive wrapped as a secret."""
    if isinstance(value, dict) and value.get("4dabf18193072939515e22adb298388d") == SECRET_SIG:
        return value["value"]
    return value


def real_password(length: int) -> str:
    """Letters and digits from the system's randomness: what the program's passwords
    (special=False) are made of."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def real_private_key(algorithm: str) -> dict[str, str]:
    """What the TLS provider computes, made with OpenSSH and OpenSSL."""
    with tempfile.TemporaryDirectory() as scratch:
        key = Path(scratch) / "key"
        if algorithm == "ED25519":
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-cluster", "-f", str(key)], check=True
            )
            private = key.read_text()
            return {
                "privateKeyOpenssh": private,
                "privateKeyPem": private,
                "publicKeyOpenssh": (Path(scratch) / "key.pub").read_text(),
            }
        subprocess.run(
            ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
            check=True,
            capture_output=True,
        )
        return {"privateKeyPem": key.read_text()}


def real_self_signed_cert(private_key_pem: str, ip_addresses: list[str]) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        key, cert = Path(scratch) / "key.pem", Path(scratch) / "cert.pem"
        key.write_text(private_key_pem)
        alt_names = ",".join(f"IP:{ip}" for ip in ip_addresses)
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-key",
                str(key),
                "-out",
                str(cert),
                "-days",
                "2",
                "-subj",
                "/CN=vllm-cluster gateway",
                "-addext",
                f"subjectAltName={alt_names}",
            ],
            check=True,
            capture_output=True,
        )
        return cert.read_text()


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, also keeping what each registration asked for
    (parent, options) that `Mocks.new_resource` is not shown."""

    def __init__(self, mocks: MockCloud):
        super().__init__(mocks)
        self.requests = []

    def RegisterResource(self, request):
        if request.type != "pulumi:pulumi:Stack":
            self.requests.append(request)
        return super().RegisterResource(request)


class _CollectWarnings:
    def __init__(self, sink: list[str]):
        self.sink = sink

    def debug(self, msg, *a, **k):
        pass

    info = debug

    def warning(self, msg, *a, **k):
        self.sink.append(str(msg))

    def error(self, msg, *a, **k):
        self.sink.append(str(msg))


def run_program(
    config: Mapping[str, Any],
    *,
    stack: str = "test",
    instance_ips: Mapping[str, str] | None = None,
    secret_keys: list[str] | None = None,
    preview: bool = False,
    apply_project: bool = True,
    public_ips: Mapping[str, str] | None = None,
    real_crypto: bool = False,
    key_store: dict | None = None,
    existing_vpc: Mapping[str, Any] | None = None,
    model_cache: Mapping[str, Any] | None = None,
    stdout_references: bool = False,
    quotas: Mapping[str, Any] | None = None,
    account: Mapping[str, int] | None = None,
    ebs_key_manager: str = "AWS",
    baked_images: Mapping[str, str] | None = None,
) -> ProgramRun:
    """Run `__main__.py` with `config` (YAML-style values; keys with or without
    the project namespace) and return what it declared and exported.

    With `apply_project` (the default) the config first goes through what the
    Pulumi CLI does with Pulumi.yaml (required keys, types, defaults); turn it off
    to hand the program a config the CLI would have let through unchecked."""
    mocks = MockCloud(
        instance_ips=instance_ips,
        public_ips=public_ips,
        real_crypto=real_crypto,
        key_store=key_store,
        existing_vpc=existing_vpc,
        model_cache=model_cache,
        stdout_references=stdout_references,
        quotas=quotas,
        account=account,
        ebs_key_manager=ebs_key_manager,
        baked_images=baked_images,
    )
    monitor = RecordingMonitor(mocks)
    run = ProgramRun()
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor, logger=_CollectWarnings(run.warnings)
    )
    engine_config = as_engine_config(apply_project_config(stack, _namespaced(config)) if apply_project else config)
    pulumi.runtime.set_all_config(engine_config, [k if ":" in k else f"{PROJECT}:{k}" for k in (secret_keys or [])])
    _run_main_into(run)
    run.resources = [_declared(request, monitor, mocks) for request in monitor.requests]
    run.invokes = mocks.invokes
    return run


def _run_main_into(run: ProgramRun) -> None:
    """Run `__main__.py` under the runtime set up for it and record its outputs (and
    which are secret) in `run`, or the error it failed with."""
    root = pulumi.runtime.settings.get_root_resource()

    async def resolve_outputs():
        for key, value in root.outputs.items():
            output = pulumi.Output.from_input(value)
            run.outputs[key] = await output.future()
            if await output.is_secret():
                run.secret_outputs.add(key)

    def program():
        runpy.run_path(str(PROGRAM), run_name="__main__")
        return resolve_outputs()

    try:
        _sync_await(run_pulumi_func(program))
    except Exception as error:  # the program's own failure is the result under test
        run.error = error


def _declared(request, monitor: RecordingMonitor, mocks: MockCloud) -> DeclaredResource:
    """A registration as the monitor received it, with the inputs the mocks were shown."""
    return DeclaredResource(
        type=request.type,
        name=request.name,
        urn=monitor.make_urn(request.parent, request.type, request.name),
        parent=request.parent,
        custom=request.custom,
        inputs=_whole_numbers(mocks.inputs.get((request.type, request.name), {})),
        retain_on_delete=bool(request.retainOnDelete),
        additional_secret_outputs=list(request.additionalSecretOutputs),
        dependencies=list(request.dependencies),
        ignore_changes=list(request.ignoreChanges),
        delete_before_replace=bool(request.deleteBeforeReplace),
    )


def run_stack(stack: str, overrides: Mapping[str, Any] | None = None, **kwargs) -> ProgramRun:
    """Run the program against `stacks/Pulumi.<stack>.yaml`, optionally with some keys changed
    (a value of None removes the key)."""
    # Secrets are ciphertext in a stack file: stand-ins, handed over as secrets, as the
    # CLI hands the program the decrypted values.
    config = stack_config(stack)
    readable, secret = readable_config(config)
    config.update({f"{PROJECT}:{key}": readable[key] for key in secret})
    kwargs.setdefault("secret_keys", secret)
    for key, value in (overrides or {}).items():
        full_key = key if ":" in key else f"{PROJECT}:{key}"
        if value is None:
            config.pop(full_key, None)
        else:
            config[full_key] = value
    return run_program(config, stack=stack, **kwargs)

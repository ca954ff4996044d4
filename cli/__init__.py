"""The operator tools behind scripts/vllm-cluster: plan (offline, the program under the mock
runtime), preflight, status, wake, stop and park (over SSH through the gateway, from the stack's
outputs).

It may import components/ (the spec, sizing, topology and the rest of the pure logic) but never
localhosts/ or tests/; status and preflight import no Pulumi package, and only mock_runtime.py
touches Pulumi's SDK internals. Nothing in components/ imports it.
"""

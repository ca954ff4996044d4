"""Moved to localhosts/pure_wheel.py (issue 37): the fleet builds the wheel, and
localhosts/ imports nothing from tools/. Kept for the importers of the old path."""

from localhosts.pure_wheel import FIXED_TIME, build, sha256_of, wheel_contents  # noqa: F401  # moved (issue 37): lead removes at integration

"""`python -m tests.moto_server HOST PORT`: moto's S3/STS/IAM server, applying STS session policies.

On AWS, a session of an assumed role may do only what both the role's policies
and the session policy passed to AssumeRole allow. moto evaluates the role's
policies only; this launcher adds the session policy to its check, so that the
tests see a vended credential refused outside its table, as AWS refuses it.
It only ever refuses more than moto alone would.
"""

from __future__ import annotations

import sys
from typing import Any

from moto.iam import access_control
from moto.server import main
from moto.sts.models import sts_backends

_role_policies_allow = access_control.IAMRequestBase.check_action_permitted


def _session_policy(access_key_id: str) -> str | None:
    for account in sts_backends.values():
        for backend in account.values():
            for role in backend.assumed_roles:
                if role.access_key_id == access_key_id:
                    return role.policy
    return None


def _check_action_permitted(self: Any, resource: str) -> None:
    _role_policies_allow(self, resource)
    if isinstance(self._access_key, access_control.AssumedRoleAccessKey):
        policy = _session_policy(self._access_key._access_key_id)
        if policy:
            verdict = access_control.IAMPolicy(policy).is_action_permitted(self._action, resource)
            if verdict != access_control.PermissionResult.PERMITTED:
                self._raise_access_denied()


access_control.IAMRequestBase.check_action_permitted = _check_action_permitted  # type: ignore[method-assign]

if __name__ == "__main__":
    main(["-H", sys.argv[1], "-p", sys.argv[2]])

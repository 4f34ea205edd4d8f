"""Schemathesis hook: signs requests with SigV4 for `execute-api`, with botocore's signer (the
one boto3 and the AWS CLI use), so that the local gateway checks what a real client sends: the
admin routes as an operator, the answers to steps as a party that answers them, the other
order routes as a client.

A request is signed only if it carries an Authorization header (the test passes a placeholder
with `--header`): schemathesis removes it from the requests that check an unsigned call is
refused, and those go out unsigned.
"""

import os

import requests
import schemathesis
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SECRET = os.environ["SIGV4_SECRET_ACCESS_KEY"]
# A client's policy allows the order routes and an operator's the admin routes, as on AWS.
CLIENT = Credentials(os.environ["SIGV4_ACCESS_KEY_ID"], SECRET)
OPERATOR = Credentials(os.environ["SIGV4_OPERATOR_ACCESS_KEY_ID"], SECRET)
ANSWERER = Credentials(os.environ["SIGV4_ANSWERER_ACCESS_KEY_ID"], SECRET)
REGION = os.environ["SIGV4_REGION"]


class SignWhenAsked(requests.auth.AuthBase):
    def __call__(self, request):
        if "Authorization" not in request.headers:
            return request
        del request.headers["Authorization"]
        signed = AWSRequest(
            method=request.method,
            url=request.url,
            data=request.body or b"",
            headers={k: v for k, v in request.headers.items() if k.lower() == "content-type"},
        )
        path = requests.utils.urlparse(request.url).path
        if path.startswith("/admin/"):
            credentials = OPERATOR
        elif "/steps/" in path:
            credentials = ANSWERER
        else:
            credentials = CLIENT
        SigV4Auth(credentials, "execute-api", REGION).add_auth(signed)
        for name in ("Authorization", "X-Amz-Date"):
            request.headers[name] = signed.headers[name]
        return request


@schemathesis.hook
def before_call(context, case, kwargs):
    kwargs["auth"] = SignWhenAsked()

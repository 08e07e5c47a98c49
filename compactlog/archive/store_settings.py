"""The environment an object store is opened with, checked before the first request, and
the one-line description of a store's error that names the setting to check.

Why checked by us: ``object_store`` (under ``obstore``) panics on an ``AWS_ENDPOINT_URL``
with no scheme, says only "builder error" for an ``http://`` endpoint without
``AWS_ALLOW_HTTP``, and with no credentials asks the cloud's instance metadata service
(``169.254.169.254``), whose timeout then names that address instead of "no credentials".
The rules (docs/archive.md section "Settings"):

- ``AWS_ENDPOINT_URL`` (and ``AWS_ENDPOINT``, ``AWS_ENDPOINT_URL_S3``) is an ``http://`` or
  ``https://`` URL with a host; ``http://`` needs ``AWS_ALLOW_HTTP=true``.
- Credentials come from ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY``, a web identity
  (``AWS_WEB_IDENTITY_TOKEN_FILE``), container credentials
  (``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` / ``_FULL_URI``), or none at all with
  ``AWS_SKIP_SIGNATURE=true`` (a public bucket). The instance metadata service is asked
  only when the environment says the process runs in EC2: ``AWS_METADATA_ENDPOINT`` or
  ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` set, or the machine's firmware naming Amazon EC2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlparse

from ..errors import ArchiveError

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
CREDENTIAL_SOURCES = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    ("AWS_WEB_IDENTITY_TOKEN_FILE",),
    ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
)
METADATA_VARIABLES = ("AWS_METADATA_ENDPOINT", "AWS_EC2_METADATA_SERVICE_ENDPOINT")
# what the firmware of an EC2 instance says (Nitro and Xen instances)
EC2_FIRMWARE = (
    ("/sys/class/dmi/id/sys_vendor", "amazon ec2"),
    ("/sys/class/dmi/id/board_vendor", "amazon ec2"),
    ("/sys/hypervisor/uuid", "ec2"),
)
CREDENTIALS_HINT = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN if temporary)"
# the store's error code -> the setting an operator checks
CODE_SETTINGS = {
    "NoSuchBucket": "the bucket in the URL, and AWS_ENDPOINT_URL",
    "AccessDenied": CREDENTIALS_HINT + ", and the bucket's policy",
    "InvalidAccessKeyId": CREDENTIALS_HINT,
    "SignatureDoesNotMatch": CREDENTIALS_HINT,
    "ExpiredToken": CREDENTIALS_HINT,
    "InvalidToken": CREDENTIALS_HINT,
    "AuthorizationHeaderMalformed": "AWS_REGION",
    "PermanentRedirect": "AWS_REGION",
    "IllegalLocationConstraintException": "AWS_REGION",
}


def true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def check_s3_environment(url: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse, naming the variable, an S3 environment that ``object_store`` would panic on,
    fail with "builder error" on, or answer by asking a metadata service this machine does
    not have."""
    env = os.environ if environ is None else environ
    for name in ENDPOINT_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ArchiveError(
                f"{name}={value!r} is not an endpoint URL; give its scheme and host, as in "
                f"http://{value.split('://')[-1]} or https://s3.example.com",
                path=url,
            )
        if parsed.scheme == "http" and not true(env.get("AWS_ALLOW_HTTP")):
            raise ArchiveError(
                f"{name}={value} is plain HTTP: set AWS_ALLOW_HTTP=true to allow it "
                "(or use https://)",
                path=url,
            )
    if true(env.get("AWS_SKIP_SIGNATURE")):
        return
    if any(all(env.get(name) for name in source) for source in CREDENTIAL_SOURCES):
        return
    if any(env.get(name) for name in METADATA_VARIABLES) or in_ec2():
        return
    raise ArchiveError(
        f"no credentials: set {CREDENTIALS_HINT} (or AWS_WEB_IDENTITY_TOKEN_FILE, "
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, or AWS_SKIP_SIGNATURE=true for a public "
        "bucket); the instance metadata service is asked only in EC2 or with "
        "AWS_METADATA_ENDPOINT set",
        path=url,
    )


def in_ec2() -> bool:
    """Whether this machine's firmware says it is an EC2 instance."""
    for path, prefix in EC2_FIRMWARE:
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                if handle.read(64).strip().lower().startswith(prefix):
                    return True
        except OSError:
            continue
    return False


_CODE = re.compile(r"<Code>([^<]+)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_STATUS = re.compile(r"status code: (\d{3}[^:<]*)")
_OS_MESSAGE = re.compile(r'message: "([^"]+)"')
_RETRIES = re.compile(r"after (\d+) retries")
_KIND = re.compile(r"kind: (Connect|Timeout|Decode|Body|Request)\b")


def describe(error: BaseException, *, scheme: str) -> str:
    """One line for an ``obstore`` error: the store's own error code and message (or what
    failed on the network) and the setting to check. ``obstore``'s text is many lines, the
    server's XML answer among them; its first line stops where the XML begins."""
    text = str(error)
    code = _CODE.search(text)
    if code is not None:
        message = _MESSAGE.search(text)
        status = _STATUS.search(text)
        what = code.group(1)
        if message is not None and message.group(1).strip():
            what += f": {message.group(1).strip()}"
        if status is not None:
            what += f" (HTTP {status.group(1).strip()})"
        return f"{what}; check {_setting(code.group(1), scheme)}"
    if "BadScheme" in text:
        return "plain HTTP refused; check AWS_ALLOW_HTTP=true (or an https:// endpoint)"
    status = _STATUS.search(text)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    first = first.split(": <?xml")[0]
    kind = _KIND.search(text)
    if status is None and (kind is not None or "HTTP error: " in first):
        detail = _OS_MESSAGE.search(text)
        reason = (
            detail.group(1)
            if detail is not None
            else first.rsplit("HTTP error: ", 1)[-1].strip() or "no answer"
        )
        retries = _RETRIES.search(first)
        if retries is not None:
            reason += f", after {retries.group(1)} retries"
        where = "AWS_ENDPOINT_URL" if scheme == "s3" else "the store's endpoint"
        return f"cannot reach the server ({reason}); check {where} and that it is up"
    if status is not None:
        return f"HTTP {status.group(1).strip()}: {first}"
    return first


def _setting(code: str, scheme: str) -> str:
    if scheme != "s3":
        return "the store's credentials and the bucket (container) in the URL"
    return CODE_SETTINGS.get(code, "AWS_ENDPOINT_URL and " + CREDENTIALS_HINT)


__all__ = ["check_s3_environment", "describe", "in_ec2"]

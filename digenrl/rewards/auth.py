"""The reward server's bearer token, on both sides of the wire (Ray-free: the client needs it).

    read_token(token_file=None)   the token: token_file's content, else $DIGENRL_REWARD_TOKEN,
                                  else the content of the file $DIGENRL_REWARD_TOKEN_FILE names;
                                  None when none is set. Never a command-line argument: a
                                  process's arguments are readable by every user of its machine
    token_digest(token)           what the server keeps and replicas receive: SHA-256 of it
    authorized(header, digest)    an Authorization header against that digest, in constant time
    is_loopback(host)             whether a listen address is reachable from this machine only

Every request to a server with a token carries `Authorization: Bearer <token>`; a missing or
wrong one gets 401 with no detail (the same answer for both).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
from pathlib import Path
from typing import Mapping, Optional

TOKEN_ENV = "DIGENRL_REWARD_TOKEN"
TOKEN_FILE_ENV = "DIGENRL_REWARD_TOKEN_FILE"
CA_ENV = "DIGENRL_REWARD_CA"  # client: a CA bundle (or the server's own certificate) to trust for https
MIN_TOKEN_CHARS = 16
NEW_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class TokenError(ValueError):
    """A token that is set but unusable (empty, too short, an unreadable file)."""


def read_token(token_file: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The token (stripped of surrounding whitespace), from the first of: `token_file`,
    $DIGENRL_REWARD_TOKEN, the file $DIGENRL_REWARD_TOKEN_FILE names. None when none is set."""
    if token_file:
        return _checked(_read_file(token_file, "--token-file"), f"the token file {token_file}")
    if environ.get(TOKEN_ENV):
        return _checked(environ[TOKEN_ENV], f"${TOKEN_ENV}")
    if environ.get(TOKEN_FILE_ENV):
        path = environ[TOKEN_FILE_ENV]
        return _checked(_read_file(path, f"${TOKEN_FILE_ENV}"), f"the token file {path} (${TOKEN_FILE_ENV})")
    return None


def token_source(token_file: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> str:
    """Where `read_token` takes the token from, for messages (never the token itself)."""
    if token_file:
        return f"the token file {token_file}"
    if environ.get(TOKEN_ENV):
        return f"${TOKEN_ENV}"
    if environ.get(TOKEN_FILE_ENV):
        return f"${TOKEN_FILE_ENV} ({environ[TOKEN_FILE_ENV]})"
    return "nowhere"


def _read_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise TokenError(f"{what}: cannot read the reward server token from {path} ({e.strerror or e})") from None


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise TokenError(f"{where}: a reward server token is at least {MIN_TOKEN_CHARS} characters with no "
                         f"whitespace (make one with: {NEW_TOKEN})")
    return token


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def bearer(token: str) -> str:
    """The Authorization header's value for `token`."""
    return f"Bearer {token}"


def authorized(header: Optional[str], digest: bytes) -> bool:
    """Does the Authorization header `header` carry the token whose digest is `digest`?

    Both sides are hashed, then compared with hmac.compare_digest: the time taken does not
    depend on how much of the token matched, nor on its length."""
    scheme, _, presented = (header or "").partition(" ")
    given = hashlib.sha256(presented.strip().encode()).digest()
    return hmac.compare_digest(given, digest) and scheme.lower() == "bearer"


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (127.0.0.0/8, ::1; 'localhost').
    0.0.0.0, '::' and any other address other machines may reach are not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)

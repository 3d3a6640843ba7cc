"""A real OpenID Connect provider on loopback (tests/oidc/provider.mjs: panva's
oidc-provider under Node.js), and a member signing in at its own login page."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from html import unescape
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from deploy.cluster import free_port
from tests.helpers.procs import ROOT, read_line

SCRIPT = ROOT / "tests" / "oidc" / "provider.mjs"
CLIENT_ID = "studio"
CLIENT_SECRET = "studio-test-secret"
BOUND = 20


def signing_key() -> dict:
    """A new RSA private key as a JWK, with a key id."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    # PyJWT marks a private key "sign" only; the provider also verifies with
    # it (an ID token handed back as the logout's hint).
    jwk.pop("key_ops", None)
    return {**jwk, "kid": uuid.uuid4().hex[:12], "use": "sig", "alg": "RS256"}


class Provider:
    """The provider process. ``accounts``: login -> claims (its groups, email...),
    read again at every sign-in."""

    def __init__(self, workdir: Path, *, redirect_uris: list[str], logout_uri: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.redirect_uris = redirect_uris
        self.logout_uri = logout_uri
        self.key = signing_key()
        self.process: subprocess.Popen | None = None
        self.accounts_file = workdir / "accounts.json"
        self.keys_file = workdir / "keys.json"
        self.accounts({})

    def accounts(self, accounts: dict[str, dict]) -> None:
        self.accounts_file.write_text(json.dumps(accounts))

    def start(self, **env: str) -> Provider:
        self.keys_file.write_text(json.dumps({"keys": [self.key]}))
        self.process = subprocess.Popen(
            [
                "node",
                str(SCRIPT),
                str(self.port),
                str(self.accounts_file),
                str(self.keys_file),
                ",".join(self.redirect_uris),
                self.logout_uri,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", **env},
        )
        assert read_line(self.process, BOUND).strip() == "ready"
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=BOUND)
            self.process = None

    def restart(self, *, rotate: bool = False, **env: str) -> None:
        """Start again (with a new signing key: the old one is gone from its JWKS)."""
        self.stop()
        if rotate:
            self.key = signing_key()
        self.start(**env)

    def settings(self) -> dict:
        """Studio's settings for this provider."""
        return {
            "STUDIO_OIDC_ISSUER": self.issuer,
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "STUDIO_OIDC_LABEL": "Test IdP",
            "STUDIO_OIDC_REVIEWER_GROUPS": ["approvers"],
            "STUDIO_OIDC_STAFF_GROUPS": ["admins"],
        }

    def env(self) -> dict[str, str]:
        """The same, as a server process's environment."""
        return {
            "STUDIO_OIDC_ISSUER": self.issuer,
            "STUDIO_OIDC_CLIENT_ID": CLIENT_ID,
            "STUDIO_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "STUDIO_OIDC_LABEL": "Test IdP",
            "STUDIO_OIDC_REVIEWER_GROUPS": "approvers",
            "STUDIO_OIDC_STAFF_GROUPS": "admins",
        }

    def token(self, claims: dict, *, key: dict | None = None) -> str:
        """An ID token signed with the provider's key (or another), for the checks
        a relying party must make on what it is handed."""
        key = key or self.key
        private = RSAAlgorithm.from_jwk(json.dumps(key))
        return jwt.encode(claims, private, algorithm="RS256", headers={"kid": key["kid"]})


def provider_login(authorize_url: str, login: str) -> str:
    """Sign in at the provider's own pages as ``login`` (its development login
    form and consent), as a browser would; the address it sends the member
    back to (Studio's callback, with the code and state)."""
    with requests.Session() as browser:
        url = authorize_url
        for _ in range(10):
            answer = browser.get(url, allow_redirects=False, timeout=BOUND)
            if answer.status_code in (302, 303):
                url = urljoin(url, answer.headers["Location"])
                if not url.startswith(authorize_url.split("/auth")[0]):
                    return url  # back to the relying party
                continue
            assert answer.status_code == 200, (answer.status_code, answer.text[:500])
            action = unescape(re.search(r'<form[^>]*action="([^"]+)"', answer.text).group(1))
            prompt = re.search(r'name="prompt" value="(\w+)"', answer.text).group(1)
            fields = {"prompt": prompt}
            if prompt == "login":
                fields |= {"login": login, "password": "any"}
            posted = browser.post(urljoin(url, action), data=fields, allow_redirects=False)
            assert posted.status_code in (302, 303), (posted.status_code, posted.text[:500])
            url = urljoin(url, posted.headers["Location"])
        raise AssertionError("the provider's sign-in did not end")


def callback_query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}

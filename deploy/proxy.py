"""A local nginx running deploy/nginx-site.conf, for tests and benchmarks.

The site file as shipped, with its upstream ports, its listen address, a
certificate and the static files' path filled in; nginx runs in the
foreground with a prefix of its own (``nginx -p``), so nothing of the
host's nginx is touched.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy.cluster import free_port

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "deploy" / "nginx-site.conf"


def nginx_path() -> str:
    """Debian's nginx, installed if it is missing (scripts/ensure-system-packages)."""
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        subprocess.run(
            [str(ROOT / "scripts" / "ensure-system-packages"), "nginx:nginx"], check=True
        )
    return found


class LocalNginx:
    def __init__(
        self,
        prefix: Path,
        upstreams: list[int],
        static_root: Path,
        *,
        tls: bool = True,
        http_upstreams: list[int] | None = None,
    ) -> None:
        """``http_upstreams``: Channels' second layout, HTTP to these (a WSGI
        server) and only ``/ws/`` to ``upstreams`` (daphne)."""
        self.prefix = prefix
        self.port = free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.ws_url = f"{'wss' if tls else 'ws'}://127.0.0.1:{self.port}"
        self.ssl: ssl.SSLContext | None = None
        site = SITE.read_text()
        servers = "".join(f"    server 127.0.0.1:{p} max_fails=0;\n" for p in upstreams)
        site = re.sub(r"(upstream studio \{\n)(?:    server .*\n)+", r"\g<1>" + servers, site)
        certificate = (
            "    ssl_certificate /etc/letsencrypt/live/studio.example.com/fullchain.pem;\n"
            "    ssl_certificate_key /etc/letsencrypt/live/studio.example.com/privkey.pem;\n"
        )
        assert certificate in site
        # The plain-HTTP server (the redirect to HTTPS) on a port of its own.
        self.http_port = free_port()
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        site = site.replace("    listen 80;\n", f"    listen 127.0.0.1:{self.http_port};\n")
        if tls:
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                 "-keyout", str(prefix / "key.pem"), "-out", str(prefix / "cert.pem")],
                check=True, capture_output=True,
            )  # fmt: skip
            self.ssl = ssl.create_default_context(cafile=str(prefix / "cert.pem"))
            site = site.replace("listen 443 ssl;", f"listen 127.0.0.1:{self.port} ssl;")
            site = site.replace(
                certificate,
                f"    ssl_certificate {prefix / 'cert.pem'};\n"
                f"    ssl_certificate_key {prefix / 'key.pem'};\n",
            )
        else:
            site = site.replace("listen 443 ssl;", f"listen 127.0.0.1:{self.port};")
            site = site.replace(certificate, "")
            site = re.sub(r"    ssl_\w+ [^\n]*;\n", "", site)
        site = site.replace("/srv/studio/staticfiles/", f"{static_root}/")
        if http_upstreams:
            servers = "".join(f"    server 127.0.0.1:{p};\n" for p in http_upstreams)
            site = f"upstream studio_http {{\n{servers}}}\n" + site
            location = site[site.index("    location / {") :]
            location = location[: location.index("\n    }\n") + 7]
            sockets = location.replace("location / {", "location /ws/ {")
            http = location.replace("proxy_pass http://studio;", "proxy_pass http://studio_http;")
            site = site.replace(location, sockets + "\n" + http)
        assert f"127.0.0.1:{self.port}" in site and f":{upstreams[0]} " in site
        (prefix / "logs").mkdir(exist_ok=True)
        (prefix / "nginx.conf").write_text(
            f"user root;\nworker_processes 1;\npid {prefix}/nginx.pid;\n"
            f"error_log {prefix}/logs/error.log;\nevents {{ worker_connections 4096; }}\n"
            f"http {{\n  include /etc/nginx/mime.types;\n"
            f"  access_log {prefix}/logs/access.log;\n{site}\n}}\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10) -> LocalNginx:
        self.proc = subprocess.Popen(
            [nginx_path(), "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf"),
             "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Our own loopback URL.
                with urllib.request.urlopen(self.url + "/healthz", timeout=1, context=self.ssl):  # noqa: S310
                    return self
            except urllib.error.HTTPError:
                return self  # it answers
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read().decode()) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    @property
    def access_log(self) -> str:
        return (self.prefix / "logs" / "access.log").read_text()

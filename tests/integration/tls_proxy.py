"""A TLS-terminating reverse proxy for tests, standing where an ingress stands in front of the gateway.

It ends TLS with a certificate of a throwaway certificate authority (``trustme``) and forwards each
request over plain HTTP to the upstream port, saying what it ended (``X-Forwarded-Proto: https``,
``X-Forwarded-For``: the client's address), and dropping any forwarded headers the client sent, as an
ingress does. One request per connection: the upstream is asked to close after its answer (which
tells the browser to reconnect for its next request), so relaying the answer is copying bytes until
the upstream's end, whatever its framing. A request's body is read by its ``Content-Length``, as
browsers and httpx send a form.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

HOST = "127.0.0.1"
DROPPED = {b"x-forwarded-proto", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-port", b"forwarded",
           b"connection", b"keep-alive", b"proxy-connection"}
"""Request headers the proxy sets itself (or, for the connection's, answers for itself)."""
HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Proxy:
    url: str
    """``https://127.0.0.1:<port>``."""
    ca: trustme.CA
    certificate_pem: bytes

    def spki_sha256(self) -> str:
        """The base64 SHA-256 of the certificate's public key (its SubjectPublicKeyInfo): what
        Chromium's ``--ignore-certificate-errors-spki-list`` takes, to trust this one certificate."""
        key = x509.load_pem_x509_certificate(self.certificate_pem).public_key()
        spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(hashlib.sha256(spki).digest()).decode()

    def client_context(self) -> ssl.SSLContext:
        """A client's TLS context trusting the proxy's certificate authority (and no other)."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


@contextlib.asynccontextmanager
async def serving(upstream_port: int) -> AsyncIterator[Proxy]:
    """The proxy, listening on a free port of 127.0.0.1 until the block ends."""
    ca = trustme.CA()
    leaf = ca.issue_cert(HOST)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    leaf.configure_cert(context)
    open_connections: set[asyncio.StreamWriter] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_connections.add(writer)
        try:
            await _forward(reader, writer, upstream_port)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError):
            pass  # the browser went away, or sent no request (a connection opened ahead of need)
        finally:
            open_connections.discard(writer)
            writer.close()

    server = await asyncio.start_server(relay, HOST, 0, ssl=context, limit=HEAD_LIMIT)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Proxy(f"https://{HOST}:{port}", ca, leaf.cert_chain_pems[0].bytes())
    finally:
        server.close()
        for writer in list(open_connections):
            writer.close()
        await server.wait_closed()


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream_port: int) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *lines = head[:-4].split(b"\r\n")
    headers = [line for line in lines if line.split(b":", 1)[0].strip().lower() not in DROPPED]
    length = next((int(line.split(b":", 1)[1]) for line in headers
                   if line.split(b":", 1)[0].strip().lower() == b"content-length"), 0)
    body = await reader.readexactly(length)
    client = writer.get_extra_info("peername")[0]
    forwarded = [*headers, b"X-Forwarded-Proto: https", f"X-Forwarded-For: {client}".encode(), b"Connection: close"]
    upstream_reader, upstream_writer = await asyncio.open_connection(HOST, upstream_port)
    try:
        upstream_writer.write(b"\r\n".join([request_line, *forwarded]) + b"\r\n\r\n" + body)
        await upstream_writer.drain()
        while chunk := await upstream_reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        upstream_writer.close()

"""The project the forge hosts, generated here: no network, no package index.

Every repository starts as a small payments application (``APPLICATION``) pinned to
``payment-sdk==4.2.0`` with three unittest tests. The forge's package index holds two releases of
that library (``RELEASES``): 5.0.0 removed ``Client.charge`` in favour of ``create_charge`` and
``create_refund``, so upgrading the pin breaks the application until every call site follows.
``PLAN_FILES`` and ``FIX_FILES`` are the scripted model's edits: the plan bumps the pin and fixes
the checkout but misses the refund, whose test then fails for real; the fix repairs it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = "payment-sdk"

_SDK_4 = '''\
"""payment-sdk 4.2.0: one call charges and refunds."""

__version__ = "4.2.0"


class Client:
    def __init__(self) -> None:
        self.ledger: list[int] = []

    def charge(self, amount_cents: int, refund: bool = False) -> dict[str, int]:
        if amount_cents <= 0:
            raise ValueError("amount_cents must be positive")
        self.ledger.append(-amount_cents if refund else amount_cents)
        return {"amount_cents": self.ledger[-1], "balance_cents": sum(self.ledger)}
'''

_SDK_5 = '''\
"""payment-sdk 5.0.0: Client.charge is gone; create_charge and create_refund replace it."""

__version__ = "5.0.0"


class Client:
    def __init__(self) -> None:
        self.ledger: list[int] = []

    def create_charge(self, amount_cents: int) -> dict[str, int]:
        return self._book(amount_cents)

    def create_refund(self, amount_cents: int) -> dict[str, int]:
        return self._book(-amount_cents)

    def _book(self, signed_cents: int) -> dict[str, int]:
        if signed_cents == 0:
            raise ValueError("amount_cents must be positive")
        self.ledger.append(signed_cents)
        return {"amount_cents": signed_cents, "balance_cents": sum(self.ledger)}
'''

RELEASES: dict[tuple[str, str], dict[str, str]] = {
    (PACKAGE, "4.2.0"): {"payment_sdk/__init__.py": _SDK_4},
    (PACKAGE, "5.0.0"): {"payment_sdk/__init__.py": _SDK_5},
}
"""The forge's package index: (name, version) -> the release's files."""

_TESTS = '''\
import unittest
from pathlib import Path

import payment_sdk
from payments.checkout import pay
from payments.refunds import refund


class PaymentsTest(unittest.TestCase):
    def test_pay_charges_the_amount(self) -> None:
        self.assertEqual(pay(payment_sdk.Client(), 1250)["balance_cents"], 1250)

    def test_refund_gives_the_amount_back(self) -> None:
        client = payment_sdk.Client()
        pay(client, 1250)
        self.assertEqual(refund(client, 250)["balance_cents"], 1000)

    def test_the_pinned_sdk_is_the_one_installed(self) -> None:
        pinned = (Path(__file__).parents[1] / "requirements.txt").read_text().split("==")[1].strip()
        self.assertEqual(payment_sdk.__version__, pinned)
'''

APPLICATION: dict[str, str] = {
    "README.md": "# payments\n\nCheckout and refunds over payment-sdk. Tests: `python -m unittest`.\n",
    "requirements.txt": "payment-sdk==4.2.0\n",
    "payments/__init__.py": "",
    "payments/checkout.py": (
        "from payment_sdk import Client\n\n\n"
        "def pay(client: Client, amount_cents: int) -> dict[str, int]:\n"
        "    return client.charge(amount_cents)\n"),
    "payments/refunds.py": (
        "from payment_sdk import Client\n\n\n"
        "def refund(client: Client, amount_cents: int) -> dict[str, int]:\n"
        "    return client.charge(amount_cents, refund=True)\n"),
    "tests/__init__.py": "",
    "tests/test_payments.py": _TESTS,
}
"""The application every repository starts as, on its ``main`` branch."""

PLAN_FILES: dict[str, str] = {
    "requirements.txt": "payment-sdk==5.0.0\n",
    "payments/checkout.py": (
        "from payment_sdk import Client\n\n\n"
        "def pay(client: Client, amount_cents: int) -> dict[str, int]:\n"
        "    return client.create_charge(amount_cents)\n"),
}
FIX_FILES: dict[str, str] = {
    "payments/refunds.py": (
        "from payment_sdk import Client\n\n\n"
        "def refund(client: Client, amount_cents: int) -> dict[str, int]:\n"
        "    return client.create_refund(amount_cents)\n"),
}


def pinned(requirements: str) -> list[tuple[str, str]]:
    """The ``name==version`` lines of a requirements file."""
    pins = []
    for line in requirements.splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins.append((name.strip(), version.strip()))
    return pins


def install_release(name: str, version: str, root: Path) -> Path:
    """The release's files under ``root/<name>-<version>`` (a directory for PYTHONPATH); KeyError
    when the index has no such release."""
    files = RELEASES[(name, version)]
    target = root / f"{name}-{version}"
    for path, text in files.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text)
    return target

"""What the scheduler admits: a tenant's slots, an input's size, waiting's weight."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting
from longrun.domain.tenant_limits import PlatformDefaults


@dataclass(frozen=True)
class AdmissionSettings(Concern):
    """Admission: the scheduler's slots and limits"""

    tenant_slots: int = setting("LONGRUN_TENANT_SLOTS", parse.positive_int, "an integer >= 1", "4")
    """Admitted, unfinished runs per tenant at most, for a tenant whose limits set no ``run_slots`` of
    its own (``PUT /tenants/{tenant_id}/limits``). The gateway reads it too: a run created over HTTP
    (``POST /runs``) is admitted at once when its tenant has a free slot, as the scheduler admits one."""
    tenant_budget_period: float = setting("LONGRUN_TENANT_BUDGET_PERIOD", parse.duration, parse.DURATION, "1d")
    """How long a tenant's budget period lasts: periods follow one another from the Unix epoch (``1d``:
    each UTC day), and a tenant's use starts afresh with each. Set it the same for the workers, the
    scheduler and the gateway."""
    tenant_token_budget: int | None = setting("LONGRUN_TENANT_TOKEN_BUDGET", parse.optional_count,
                                              "an integer >= 0, or empty: unlimited", "")
    """Model tokens (input and output) a tenant's runs may use per period, for a tenant whose limits
    set no ``token_budget``; empty: unlimited. A tenant that reaches it gets no new admissions until
    the period rolls over or its budget is raised."""
    tenant_cost_budget: float | None = setting("LONGRUN_TENANT_COST_BUDGET", parse.optional_amount,
                                               "a number >= 0, or empty: unlimited", "")
    """Model cost a tenant's runs may spend per period, for a tenant whose limits set no
    ``cost_budget``; empty: unlimited. Reaching it holds admissions as the token budget does."""
    producer_tenants: tuple[tuple[str, str], ...] = setting(
        "LONGRUN_PRODUCER_TENANTS", parse.named_references, "comma-separated user=tenant (tenant * for every tenant)",
        "")
    """The tenants each broker user may create runs in: ``user=tenant``, comma-separated, once per
    tenant (``user=*``: every tenant). The runtime's own user (``LONGRUN_AMQP_URL``'s) may create in
    every tenant; ``guest`` only when the broker is on this machine (development). A ``run.create``
    whose AMQP ``user_id`` is missing or not allowed its tenant is refused (``tenant_not_allowed``)."""
    max_input_bytes: int = setting("LONGRUN_MAX_INPUT_BYTES", parse.positive_int, "bytes, an integer >= 1",
                                   "262144")
    """Largest ``run.create`` input accepted, in bytes of its JSON; a larger one is refused with
    ``run.rejected`` (input_too_large), on the bus and by the gateway's ``POST /runs`` alike (set it the
    same for both). Large inputs belong in the artifact store, referenced by hash."""
    priority_aging: float = setting("LONGRUN_PRIORITY_AGING", parse.positive_float, "seconds, a number > 0", "30")
    """Seconds of waiting that count as one priority point (so nothing starves)."""

    def tenant_defaults(self) -> PlatformDefaults:
        """What a tenant whose limits set nothing gets."""
        return PlatformDefaults(self.tenant_slots, self.tenant_token_budget, self.tenant_cost_budget)

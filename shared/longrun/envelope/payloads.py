"""Payload models, one per (type, schema_version): defined in ``longrun_client.payloads`` (the
public contract) and re-exported here for the runtime. Published contract: see schemas/."""

from __future__ import annotations

from longrun_client.payloads import (Acceptance, BudgetLimits, PinnedVersionsV1, PublicReceipt, RejectionCode,
                                     RejectionCodeV2, RunAcceptedV1, RunAcceptedV2, RunCreateV1, RunCreateV2,
                                     RunCreateV3, RunCreateV4, RunEventV1, RunEventV2, RunEventV3, RunNoticeV1,
                                     RunOutcome, RunOutcomeV3, RunRejectedV1, RunRejectedV2, RunRejectedV3, RunScope,
                                     RunSignalV1, RunSummary, RunTimeouts, RunWakeupV1, SignalRejectionCode)

__all__ = ["Acceptance", "BudgetLimits", "PinnedVersionsV1", "PublicReceipt", "RejectionCode",
           "RejectionCodeV2", "RunAcceptedV1", "RunAcceptedV2", "RunCreateV1", "RunCreateV2", "RunCreateV3",
           "RunCreateV4", "RunEventV1", "RunEventV2", "RunEventV3", "RunNoticeV1", "RunOutcome", "RunOutcomeV3",
           "RunRejectedV1", "RunRejectedV2", "RunRejectedV3", "RunScope", "RunSignalV1", "RunSummary",
           "RunTimeouts", "RunWakeupV1", "SignalRejectionCode"]

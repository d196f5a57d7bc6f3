"""longrun-client: create longrun runs and follow their events over RabbitMQ.

The envelope and payload models here are the bus contract itself: the runtime imports them from
this package. Importing it loads no database driver and no runtime code.
"""

from __future__ import annotations

from longrun_client.client import Client
from longrun_client.consumer import DurableConsumer, Missed
from longrun_client.follow import Chunk, ChunksMissed, StatusEvent, follow
from longrun_client.errors import (DecodeError, LongrunError, PoisonMessage, PublishNotConfirmed, RunRejected,
                                   UnknownSchemaVersion)
from longrun_client.model import DataClass, Envelope
from longrun_client.payloads import (BudgetLimits, RejectionCode, RunAcceptedV1, RunAcceptedV2, RunCreateV2,
                                     RunCreateV3, RunCreateV4, RunEventV2, RunEventV3, RunNoticeV1, RunOutcome,
                                     RunOutcomeV3, RunRejectedV2, RunRejectedV3, RunScope, RunSignalV1, RunSummary,
                                     RunTimeouts, SignalRejectionCode)
from longrun_client.pending import correlation_id_of
from longrun_client.registry import decode, encode, make
from longrun_client.resequence import Gap, Late
from longrun_client.retry import Backoff
from longrun_client.stream import EventStream

__version__ = "0.1.0"
"""The release, the runtime's too (``longrun.__version__``): the two are released together."""

__all__ = ["Backoff", "BudgetLimits", "Chunk", "ChunksMissed", "Client", "DataClass", "DecodeError", "DurableConsumer", "Envelope",
           "EventStream", "Gap", "Late", "LongrunError", "Missed", "PoisonMessage", "PublishNotConfirmed", "RejectionCode",
           "RunAcceptedV1", "RunAcceptedV2", "RunCreateV2", "RunCreateV3", "RunCreateV4", "RunEventV2",
           "RunEventV3", "RunNoticeV1", "RunOutcome", "RunOutcomeV3", "RunRejected", "RunRejectedV2",
           "RunRejectedV3", "RunScope", "RunSignalV1", "RunSummary", "RunTimeouts", "SignalRejectionCode",
           "StatusEvent", "UnknownSchemaVersion", "__version__", "correlation_id_of", "decode", "encode", "follow",
           "make"]
